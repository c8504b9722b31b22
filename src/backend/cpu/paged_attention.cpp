// CPU reference of the paged KV cache's operators: plain loops that the CUDA kernels are checked against.
// Unlike the CUDA kernels, which skip bad slots / blocks / seq ids and report them later, the reference
// reads the index tensors up front (they are in host memory anyway) and throws IndexError naming the row,
// before any thread starts or any output is written.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_backend.h"
#include "dispatch.h"

namespace microllm {
namespace {

// Element i of a rank-1 i32 tensor of any stride.
int64_t at(const Tensor& t, int64_t i) { return static_cast<const int32_t*>(t.data_ptr())[i * t.stride(0)]; }
// Element (r, c) of a rank-2 i32 tensor of any strides.
int64_t at(const Tensor& t, int64_t r, int64_t c) {
  return static_cast<const int32_t*>(t.data_ptr())[r * t.stride(0) + c * t.stride(1)];
}

// A pool [num_blocks, block_size, Hkv, D] of any strides: the start of token slot `slot`'s row of kv head h.
template <typename T>
struct Pool {
  T* data;
  int64_t num_blocks, block_size, s0, s1, s2, step;
  explicit Pool(const Tensor& t)
      : data(static_cast<T*>(t.data_ptr())),
        num_blocks(t.size(0)),
        block_size(t.size(1)),
        s0(t.stride(0)),
        s1(t.stride(1)),
        s2(t.stride(2)),
        step(t.stride(3)) {}
  T* row(int64_t block, int64_t in_block, int64_t h) const { return data + block * s0 + in_block * s1 + h * s2; }
  T* slot_row(int64_t slot, int64_t h) const { return row(slot / block_size, slot % block_size, h); }
};

// Throws unless every block that keys 0..length-1 of block table row `seq` touch is a pool block.
void check_blocks(const char* op, const Tensor& tables, int64_t seq, int64_t length, int64_t block_size,
                  int64_t num_blocks, const char* row_name) {
  for (int64_t b = 0; b * block_size < length; ++b) {
    const int64_t block = tables.dim() == 2 ? at(tables, seq, b) : at(tables, b);
    MICROLLM_CHECK(block >= 0 && block < num_blocks, IndexError, op, row_name, "[", b, "] = ", block,
                   " is not a block of the pool's ", num_blocks, " (needed for ", length, " tokens)");
  }
}

}  // namespace

void CpuBackend::paged_kv_write(const Tensor& k_pool, const Tensor& v_pool, const Tensor& k, const Tensor& v,
                                const Tensor& slots) {
  const char* op = "paged_kv_write";
  const int64_t n_rows = k.size(0), heads = k.size(1), dim = k.size(2);
  const int64_t n_slots = k_pool.size(0) * k_pool.size(1);
  for (int64_t n = 0; n < n_rows; ++n) {
    const int64_t slot = at(slots, n);
    MICROLLM_CHECK(slot < n_slots, IndexError, op, "slots[", n, "] = ", slot, " is past the pools' ", n_slots,
                   " slots (", k_pool.size(0), " blocks of ", k_pool.size(1), ")");
  }
  cpu::visit_float(k_pool.dtype(), op, [&]<typename P>() {
    cpu::visit_float(k.dtype(), op, [&]<typename T>() {
      const Pool<P> kp(k_pool), vp(v_pool);
      const T* ks = static_cast<const T*>(k.data_ptr());
      const T* vs = static_cast<const T*>(v.data_ptr());
      detail::parallel_for(0, n_rows * heads, std::max<int64_t>(1, detail::kParallelGrain / dim),
                           [&](int64_t lo, int64_t hi) {
                             for (int64_t r = lo; r < hi; ++r) {
                               const int64_t n = r / heads, h = r % heads, slot = at(slots, n);
                               if (slot < 0) continue;  // padding row
                               P* kd = kp.slot_row(slot, h);
                               P* vd = vp.slot_row(slot, h);
                               const T* kr = ks + n * k.stride(0) + h * k.stride(1);
                               const T* vr = vs + n * v.stride(0) + h * v.stride(1);
                               for (int64_t d = 0; d < dim; ++d) {
                                 cpu::store(kd + d * kp.step, cpu::load(kr + d * k.stride(2)));
                                 cpu::store(vd + d * vp.step, cpu::load(vr + d * v.stride(2)));
                               }
                             }
                           });
    });
  });
}

void CpuBackend::paged_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                                 const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions,
                                 double scale, int64_t max_context, const Tensor& out, int64_t window) {
  const char* op = "paged_attention";
  const int64_t n_tokens = q.size(0), q_heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_pool.size(2), group = q_heads / kv_heads;
  const int64_t block_size = k_pool.size(1), num_blocks = k_pool.size(0);
  const int64_t n_seqs = block_tables.size(0);
  for (int64_t n = 0; n < n_tokens; ++n) {
    const int64_t pos = at(positions, n);
    if (pos < 0) continue;  // padding row
    const int64_t seq = at(seq_ids, n);
    MICROLLM_CHECK(seq >= 0 && seq < n_seqs, IndexError, op, "seq_ids[", n, "] = ", seq,
                   " is not a row of block_tables ", block_tables.shape());
    MICROLLM_CHECK(pos < max_context, IndexError, op, "positions[", n, "] = ", pos, " needs ", pos + 1,
                   " keys, more than max_context ", max_context);
    check_blocks(op, block_tables, seq, pos + 1, block_size, num_blocks, "block_tables row");
  }
  cpu::visit_float(q.dtype(), op, [&]<typename T>() {
    using A = cpu::acc_t<T>;
    const Pool<T> kp(k_pool), vp(v_pool);
    const T* qs = static_cast<const T*>(q.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());  // [N, Hq, D] contiguous
    const A s = A(scale);
    // One query row (n, h) at a time: all its scores, then the softmax-weighted sum of the values.
    const int64_t grain = std::max<int64_t>(1, detail::kParallelGrain / std::max<int64_t>(2 * max_context * dim, 1));
    detail::parallel_for(0, n_tokens * q_heads, grain, [&](int64_t lo, int64_t hi) {
      std::vector<A> scores, acc(static_cast<size_t>(dim));
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t n = r / q_heads, h = r % q_heads, hk = h / group;
        const int64_t pos = at(positions, n);
        T* out_row = o + r * dim;
        if (pos < 0) {
          for (int64_t d = 0; d < dim; ++d) cpu::store(out_row + d, A(0));
          continue;
        }
        // Keys first..pos: the sliding window's latest `window` (itself included), or all of them.
        const int64_t seq = at(seq_ids, n), first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
        const int64_t keys = pos + 1 - first;
        const T* qr = qs + n * q.stride(0) + h * q.stride(1);
        auto key_row = [&](const Pool<T>& pool, int64_t j) {
          return pool.row(at(block_tables, seq, j / block_size), j % block_size, hk);
        };
        scores.resize(static_cast<size_t>(keys));
        A max = -std::numeric_limits<A>::infinity();
        for (int64_t j = 0; j < keys; ++j) {
          const T* kr = key_row(kp, first + j);
          A dot = 0;
          for (int64_t d = 0; d < dim; ++d) dot += A(cpu::load(qr + d * q.stride(2))) * A(cpu::load(kr + d * kp.step));
          scores[j] = s * dot;
          max = std::max(max, scores[j]);
        }
        std::fill(acc.begin(), acc.end(), A(0));
        A sum = 0;
        for (int64_t j = 0; j < keys; ++j) {
          const A p = std::exp(scores[j] - max);
          sum += p;
          const T* vr = key_row(vp, first + j);
          for (int64_t d = 0; d < dim; ++d) acc[d] += p * A(cpu::load(vr + d * vp.step));
        }
        for (int64_t d = 0; d < dim; ++d) cpu::store(out_row + d, acc[d] / sum);
      }
    });
  });
}

// The reference is the composition (Fusions' default); first the contract the fused CUDA kernel relies on:
// each real row's slot is its position's slot in its sequence's blocks, one row per sequence, and padding
// rows write nothing.
void CpuFusions::paged_decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope,
                                        const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots,
                                        const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions,
                                        double scale, int64_t max_context, const Tensor& out, int64_t window,
                                        const QkNormParams& qk_norm) {
  const char* op = "paged_decode_attention";
  const int64_t block_size = k_pool.size(1), num_blocks = k_pool.size(0), n_seqs = block_tables.size(0);
  std::vector<bool> seen(static_cast<size_t>(n_seqs), false);
  for (int64_t n = 0; n < q.size(0); ++n) {
    const int64_t pos = at(positions, n), slot = at(slots, n);
    if (pos < 0) {
      MICROLLM_CHECK(slot < 0, IndexError, op, "slots[", n, "] = ", slot, " but row ", n, " is padding (positions[", n,
                     "] = ", pos, "), which writes nothing: its slot must be < 0");
      continue;
    }
    const int64_t seq = at(seq_ids, n);
    MICROLLM_CHECK(seq >= 0 && seq < n_seqs, IndexError, op, "seq_ids[", n, "] = ", seq,
                   " is not a row of block_tables ", block_tables.shape());
    MICROLLM_CHECK(!seen[static_cast<size_t>(seq)], IndexError, op, "seq_ids[", n, "] = ", seq,
                   " appears twice: a decode step takes one token per sequence");
    seen[static_cast<size_t>(seq)] = true;
    MICROLLM_CHECK(pos < max_context, IndexError, op, "positions[", n, "] = ", pos, " needs ", pos + 1,
                   " keys, more than max_context ", max_context);
    check_blocks(op, block_tables, seq, pos + 1, block_size, num_blocks, "block_tables row");
    const int64_t expected = at(block_tables, seq, pos / block_size) * block_size + pos % block_size;
    MICROLLM_CHECK(slot == expected, IndexError, op, "slots[", n, "] = ", slot, " is not the slot of position ", pos,
                   " of sequence ", seq, ", which block_tables puts at ", expected);
  }
  Fusions::paged_decode_attention(q, k, v, rope, k_pool, v_pool, slots, block_tables, seq_ids, positions, scale,
                                  max_context, out, window, qk_norm);
}

void CpuBackend::paged_decode_advance(const Tensor& inputs, const Tensor& block_tables, int64_t block_size,
                                      const Tensor& ids, const Tensor& outbox, const Tensor& counter) {
  if (ids.defined()) {  // hand the ids over first: a step's ids and inputs are independent
    // The counter counts modulo 2^32 (an i32 read as unsigned): it wraps to 0 instead of going negative.
    auto* count = static_cast<uint32_t*>(counter.data_ptr());
    auto* row =
        static_cast<int32_t*>(outbox.data_ptr()) + static_cast<int64_t>(*count % outbox.size(0)) * outbox.stride(0);
    for (int64_t n = 0; n < ids.size(0); ++n) row[n] = static_cast<int32_t>(at(ids, n));
    *count += 1u;
  }
  const int64_t batch = inputs.size(1), columns = block_tables.size(1);
  auto* rope_positions = static_cast<int32_t*>(inputs.data_ptr());
  int32_t* positions = rope_positions + batch;
  int32_t* slots = positions + batch;
  for (int64_t b = 0; b < batch; ++b) {
    if (positions[b] < 0) continue;  // not fed
    const int64_t next = positions[b] + 1, column = next / block_size;
    rope_positions[b] += 1;
    positions[b] = static_cast<int32_t>(next);
    slots[b] =
        column < columns ? static_cast<int32_t>(at(block_tables, b, column) * block_size + next % block_size) : -1;
  }
}

void CpuBackend::paged_gather(const Tensor& pool, const Tensor& block_table_row, int64_t length, const Tensor& out) {
  const char* op = "paged_gather";
  const int64_t block_size = pool.size(1), heads = pool.size(2), dim = pool.size(3);
  check_blocks(op, block_table_row, 0, length, block_size, pool.size(0), "block_table_row");
  cpu::visit_float(pool.dtype(), op, [&]<typename T>() {
    const Pool<T> p(pool);
    T* o = static_cast<T*>(out.data_ptr());  // [length, Hkv, D] contiguous
    detail::parallel_for(0, length * heads, std::max<int64_t>(1, detail::kParallelGrain / dim),
                         [&](int64_t lo, int64_t hi) {
                           for (int64_t r = lo; r < hi; ++r) {
                             const int64_t j = r / heads, h = r % heads;
                             const T* src = p.row(at(block_table_row, j / block_size), j % block_size, h);
                             for (int64_t d = 0; d < dim; ++d) o[r * dim + d] = src[d * p.step];
                           }
                         });
  });
}

}  // namespace microllm
