// The paged KV cache's operators: argument checks and dispatch. Only what the host knows is checked here
// (shapes, dtypes, devices); the values of slots, block tables, seq ids and positions stay on the device
// (see include/microllm/ops/paged_attention.h for who checks them).
#include "microllm/ops/paged_attention.h"

#include <cmath>
#include <utility>

#include "checks.h"
#include "microllm/backend/fusions.h"
#include "microllm/ops/rope.h"

namespace microllm {
namespace {

// A pool [num_blocks, block_size, Hkv, D] of f32, f16 or bf16 (the dtypes the CUDA kernels take), or f64 on the
// CPU (the reference's exact comparisons: an engine against generate() without f32 roundings between them).
void check_pool(const char* op, const Tensor& pool, const char* name) {
  checks::floating(op, pool, name);
  MICROLLM_CHECK(pool.dtype() != DType::f64 || pool.device().is_cpu(), DTypeError, op, name,
                 " must be f32, f16 or bf16 on ", pool.device(), " (f64 pools are for the CPU), got ", pool.dtype());
  checks::rank(op, pool, name, 4);
  MICROLLM_CHECK(pool.size(1) > 0 && pool.size(2) > 0 && pool.size(3) > 0, ShapeError, op, name, " shape ",
                 pool.shape(), " must have a positive block_size, Hkv and D ([num_blocks, block_size, Hkv, D])");
}

void check_pools(const char* op, const Tensor& k_pool, const Tensor& v_pool) {
  check_pool(op, k_pool, "k_pool");
  check_pool(op, v_pool, "v_pool");
  checks::same_shape(op, k_pool, "k_pool", v_pool, "v_pool");
  checks::same_dtype(op, k_pool, "k_pool", v_pool, "v_pool");
  checks::same_device(op, k_pool, "k_pool", v_pool, "v_pool");
}

// An i32 index tensor of the given rank on the pools' device.
void check_index(const char* op, const Tensor& t, const char* name, int rank, const Tensor& pool) {
  checks::defined(op, t, name);
  MICROLLM_CHECK(t.dtype() == DType::i32, DTypeError, op, name, " must be i32, got ", t.dtype());
  checks::rank(op, t, name, rank);
  checks::same_device(op, pool, "k_pool", t, name);
}

// Checks every argument of paged_attention; returns max_context resolved (0 -> the block table's capacity).
int64_t check_attention(const char* op, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                        const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions, double scale,
                        int64_t max_context, int64_t window) {
  check_pools(op, k_pool, v_pool);
  checks::floating(op, q, "q");
  checks::same_dtype(op, k_pool, "k_pool", q, "q");
  checks::same_device(op, k_pool, "k_pool", q, "q");
  checks::rank(op, q, "q", 3);
  const int64_t kv_heads = k_pool.size(2), dim = k_pool.size(3);
  MICROLLM_CHECK(q.size(2) == dim, ShapeError, op, "q shape ", q.shape(), " has head dim ", q.size(2),
                 " but k_pool shape ", k_pool.shape(), " has head dim ", dim);
  MICROLLM_CHECK(q.size(1) > 0 && q.size(1) % kv_heads == 0, ShapeError, op, "q shape ", q.shape(), " has ", q.size(1),
                 " heads, which is not a positive multiple of the ", kv_heads, " kv heads of k_pool ", k_pool.shape());
  check_index(op, block_tables, "block_tables", 2, k_pool);
  check_index(op, seq_ids, "seq_ids", 1, k_pool);
  check_index(op, positions, "positions", 1, k_pool);
  MICROLLM_CHECK(block_tables.size(0) > 0 && block_tables.size(1) > 0, ShapeError, op, "block_tables shape ",
                 block_tables.shape(), " must have at least one sequence and one block ([S, max_blocks])");
  MICROLLM_CHECK(seq_ids.size(0) == q.size(0), ShapeError, op, "seq_ids shape ", seq_ids.shape(),
                 " does not match the ", q.size(0), " query tokens of q ", q.shape());
  MICROLLM_CHECK(positions.size(0) == q.size(0), ShapeError, op, "positions shape ", positions.shape(),
                 " does not match the ", q.size(0), " query tokens of q ", q.shape());
  MICROLLM_CHECK(std::isfinite(scale), ValueError, op, "scale must be finite, got ", scale);
  MICROLLM_CHECK(window >= 0, ValueError, op, "window must be >= 0 (0: none), got ", window);
  const int64_t capacity = block_tables.size(1) * k_pool.size(1);
  MICROLLM_CHECK(max_context >= 0 && max_context <= capacity, ValueError, op, "max_context must lie in [0, ", capacity,
                 "] (max_blocks ", block_tables.size(1), " * block_size ", k_pool.size(1), "), got ", max_context);
  MICROLLM_CHECK(capacity < (int64_t{1} << 31), ValueError, op, "a sequence of up to ", capacity,
                 " tokens (block_tables ", block_tables.shape(), ", k_pool ", k_pool.shape(),
                 ") does not fit the i32 positions");
  return max_context > 0 ? max_context : capacity;
}

// A given output of paged_attention / paged_decode_attention: [N, Hq, D] like q, contiguous.
void check_out(const char* op, const Tensor& q, const Tensor& out) {
  checks::defined(op, out, "out");
  checks::same_shape(op, q, "q", out, "out");
  checks::same_dtype(op, q, "q", out, "out");
  checks::same_device(op, q, "q", out, "out");
  MICROLLM_CHECK(out.is_contiguous(), ShapeError, op, "out must be contiguous, got shape ", out.shape(),
                 " with strides ", out.strides());
}

// A decode step's new keys and values (k, v [N, Hkv, D] like the pools), the rotary parameters, slots [N] and the
// QK-norm weights where defined.
void check_new_kv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_pool,
                  const RopeParams& rope, const Tensor& slots, const QkNormParams& qk_norm) {
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{k, "k"}, {v, "v"}}) {
    checks::floating(op, t, name);
    checks::rank(op, t, name, 3);
    checks::same_dtype(op, k_pool, "k_pool", t, name);
    checks::same_device(op, k_pool, "k_pool", t, name);
    MICROLLM_CHECK(t.size(0) == q.size(0) && t.size(1) == k_pool.size(2) && t.size(2) == k_pool.size(3), ShapeError, op,
                   name, " shape ", t.shape(), " must be [N, Hkv, D] = [", q.size(0), ", ", k_pool.size(2), ", ",
                   k_pool.size(3), "] (q ", q.shape(), ", k_pool ", k_pool.shape(), ")");
  }
  MICROLLM_CHECK(q.size(2) % 2 == 0, ShapeError, op, "the rotary embedding needs an even head dim, got q shape ",
                 q.shape());
  rope_inv_freq(rope, q.size(2));  // checks the rotary parameters
  if (qk_norm.defined()) checks::qk_norm_weights(op, q, qk_norm.q_weight, qk_norm.k_weight, qk_norm.eps);
  check_index(op, slots, "slots", 1, k_pool);
  MICROLLM_CHECK(slots.size(0) == q.size(0), ShapeError, op, "slots shape ", slots.shape(), " does not match the ",
                 q.size(0), " query tokens of q ", q.shape());
}

}  // namespace

void paged_kv_write(const Tensor& k_pool, const Tensor& v_pool, const Tensor& k, const Tensor& v, const Tensor& slots) {
  const char* op = "paged_kv_write";
  check_pools(op, k_pool, v_pool);
  checks::floating(op, k, "k");
  checks::floating(op, v, "v");
  checks::rank(op, k, "k", 3);
  checks::same_shape(op, k, "k", v, "v");
  checks::same_device(op, k_pool, "k_pool", k, "k");
  checks::same_device(op, k_pool, "k_pool", v, "v");
  MICROLLM_CHECK(k.size(1) == k_pool.size(2) && k.size(2) == k_pool.size(3), ShapeError, op, "k shape ", k.shape(),
                 " must be [N, Hkv, D] with the Hkv and D of k_pool ", k_pool.shape());
  check_index(op, slots, "slots", 1, k_pool);
  MICROLLM_CHECK(slots.size(0) == k.size(0), ShapeError, op, "slots shape ", slots.shape(), " does not match the ",
                 k.size(0), " rows of k ", k.shape());
  if (k.size(0) == 0) return;
  backend_for(k_pool.device()).paged_kv_write(k_pool, v_pool, k, v, slots);
}

Tensor paged_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const Tensor& block_tables,
                       const Tensor& seq_ids, const Tensor& positions, double scale, int64_t max_context,
                       int64_t window) {
  const char* op = "paged_attention";
  const int64_t context =
      check_attention(op, q, k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context, window);
  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());  // [N, Hq, D]
  if (out.numel() == 0) return out;
  const double s = scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  backend_for(q.device()).paged_attention(q, k_pool, v_pool, block_tables, seq_ids, positions, s, context, out, window);
  return out;
}

void paged_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const Tensor& block_tables,
                     const Tensor& seq_ids, const Tensor& positions, double scale, int64_t max_context,
                     const Tensor& out, int64_t window) {
  const char* op = "paged_attention";
  const int64_t context =
      check_attention(op, q, k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context, window);
  check_out(op, q, out);
  if (out.numel() == 0) return;
  const double s = scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  backend_for(q.device()).paged_attention(q, k_pool, v_pool, block_tables, seq_ids, positions, s, context, out, window);
}

void paged_decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope,
                            const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots, const Tensor& block_tables,
                            const Tensor& seq_ids, const Tensor& positions, double scale, int64_t max_context,
                            const Tensor& out, int64_t window, const QkNormParams& qk_norm) {
  const char* op = "paged_decode_attention";
  const int64_t context =
      check_attention(op, q, k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context, window);
  check_new_kv(op, q, k, v, k_pool, rope, slots, qk_norm);
  check_out(op, q, out);
  if (out.numel() == 0) return;
  const double s = scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  fusions_for(q.device())
      .paged_decode_attention(q, k, v, rope, k_pool, v_pool, slots, block_tables, seq_ids, positions, s, context, out,
                              window, qk_norm);
}

void paged_decode_attention_projected(const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope,
                                      const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots,
                                      const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions,
                                      double scale, int64_t max_context, const Tensor& o_weight, const Tensor& addend,
                                      const Tensor& out, int64_t window, const QkNormParams& qk_norm) {
  const char* op = "paged_decode_attention_projected";
  checks::defined(op, q, "q");
  checks::rank(op, q, "q", 3);
  checks::defined(op, o_weight, "o_weight");
  checks::rank(op, o_weight, "o_weight", 2);
  checks::same_dtype(op, q, "q", o_weight, "o_weight");
  checks::same_device(op, q, "q", o_weight, "o_weight");
  const int64_t tokens = q.size(0), hidden = o_weight.size(0);
  MICROLLM_CHECK(o_weight.size(1) == q.size(1) * q.size(2), ShapeError, op, "o_weight shape ", o_weight.shape(),
                 " must be [hidden, Hq * D] with Hq * D = ", q.size(1) * q.size(2), " (q ", q.shape(), ")");
  checks::defined(op, out, "out");
  checks::same_dtype(op, q, "q", out, "out");
  checks::same_device(op, q, "q", out, "out");
  MICROLLM_CHECK(out.shape() == Shape({tokens, hidden}) && out.is_contiguous(), ShapeError, op, "out must be [", tokens,
                 ", ", hidden, "] contiguous (q ", q.shape(), ", o_weight ", o_weight.shape(), "), got shape ",
                 out.shape(), " with strides ", out.strides());
  if (addend.defined()) {
    checks::same_dtype(op, q, "q", addend, "addend");
    checks::same_device(op, q, "q", addend, "addend");
    MICROLLM_CHECK(addend.shape() == out.shape(), ShapeError, op, "addend shape ", addend.shape(),
                   " does not match out ", out.shape());
  }
  const int64_t context =
      check_attention(op, q, k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context, window);
  check_new_kv(op, q, k, v, k_pool, rope, slots, qk_norm);
  if (out.numel() == 0) return;
  const double s = scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  fusions_for(q.device())
      .paged_decode_attention_projected(q, k, v, rope, k_pool, v_pool, slots, block_tables, seq_ids, positions, s,
                                        context, o_weight, addend.defined() ? addend.contiguous() : Tensor(), out,
                                        window, qk_norm);
}

std::pair<Tensor, Tensor> paged_rope_kv_write(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& positions, const RopeParams& rope, const Tensor& k_pool,
                                              const Tensor& v_pool, const Tensor& slots) {
  const char* op = "paged_rope_kv_write";
  check_pools(op, k_pool, v_pool);
  const Tensor pos = checks::rope_positions(op, q, "q", positions, rope);  // k and v: q's B, T and D below
  const int64_t kv_heads = k_pool.size(2), dim = k_pool.size(3);
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{q, "q"}, {k, "k"}, {v, "v"}}) {
    checks::rank(op, t, name, 4);
    checks::same_dtype(op, k_pool, "k_pool", t, name);
    checks::same_device(op, k_pool, "k_pool", t, name);
    MICROLLM_CHECK(t.size(0) == q.size(0) && t.size(1) == q.size(1) && t.size(3) == dim, ShapeError, op, name,
                   " shape ", t.shape(), " must be [B, T, H, D] with q's B and T (q ", q.shape(),
                   ") and the D of k_pool ", k_pool.shape());
  }
  checks::same_shape(op, k, "k", v, "v");
  MICROLLM_CHECK(k.size(2) == kv_heads, ShapeError, op, "k shape ", k.shape(), " must have the ", kv_heads,
                 " kv heads of k_pool ", k_pool.shape());
  MICROLLM_CHECK(q.size(2) > 0 && q.size(2) % kv_heads == 0, ShapeError, op, "q shape ", q.shape(), " has ", q.size(2),
                 " heads, which is not a positive multiple of the ", kv_heads, " kv heads of k_pool ", k_pool.shape());
  check_index(op, slots, "slots", 1, k_pool);
  MICROLLM_CHECK(slots.size(0) == q.size(0) * q.size(1), ShapeError, op, "slots shape ", slots.shape(),
                 " does not match the ", q.size(0) * q.size(1), " tokens of q ", q.shape());
  Tensor q_out = Tensor::empty(q.shape(), q.dtype(), q.device());
  Tensor k_out = Tensor::empty(k.shape(), k.dtype(), k.device());
  if (q.numel() > 0) {
    fusions_for(q.device()).paged_rope_kv_write(q, k, v, pos, rope, k_pool, v_pool, slots, q_out, k_out);
  }
  return {q_out, k_out};
}

Tensor paged_gather(const Tensor& pool, const Tensor& block_table_row, int64_t length) {
  const char* op = "paged_gather";
  check_pool(op, pool, "pool");
  checks::defined(op, block_table_row, "block_table_row");
  MICROLLM_CHECK(block_table_row.dtype() == DType::i32, DTypeError, op, "block_table_row must be i32, got ",
                 block_table_row.dtype());
  checks::rank(op, block_table_row, "block_table_row", 1);
  checks::same_device(op, pool, "pool", block_table_row, "block_table_row");
  const int64_t capacity = block_table_row.size(0) * pool.size(1);
  MICROLLM_CHECK(length >= 0 && length <= capacity, ValueError, op, "length must lie in [0, ", capacity,
                 "] (block_table_row ", block_table_row.shape(), " of blocks of ", pool.size(1), " tokens), got ",
                 length);
  Tensor out = Tensor::empty({length, pool.size(2), pool.size(3)}, pool.dtype(), pool.device());
  if (length == 0) return out;
  backend_for(pool.device()).paged_gather(pool, block_table_row, length, out);
  return out;
}

void paged_decode_advance(const Tensor& inputs, const Tensor& block_tables, int64_t block_size, const Tensor& ids,
                          const Tensor& outbox, const Tensor& counter) {
  const char* op = "paged_decode_advance";
  const auto i32 = [&](const Tensor& t, const char* name, int rank) {
    checks::defined(op, t, name);
    MICROLLM_CHECK(t.dtype() == DType::i32, DTypeError, op, name, " must be i32, got ", t.dtype());
    checks::rank(op, t, name, rank);
    checks::same_device(op, inputs, "inputs", t, name);
  };
  i32(inputs, "inputs", 2);
  MICROLLM_CHECK(inputs.size(0) == 3 && inputs.is_contiguous(), ShapeError, op, "inputs shape ", inputs.shape(),
                 " must be a contiguous [3, B] (rotary positions, attention positions, slots)");
  i32(block_tables, "block_tables", 2);
  MICROLLM_CHECK(block_tables.size(0) == inputs.size(1) && block_tables.size(1) > 0, ShapeError, op,
                 "block_tables shape ", block_tables.shape(), " must be [B, max_blocks] with the B of inputs ",
                 inputs.shape());
  MICROLLM_CHECK(block_size >= 1, ValueError, op, "block_size must be >= 1, got ", block_size);
  const bool hand_over = ids.defined() || outbox.defined() || counter.defined();
  if (hand_over) {
    i32(ids, "ids", 1);
    i32(outbox, "outbox", 2);
    i32(counter, "counter", 1);
    MICROLLM_CHECK(outbox.size(0) >= 1 && outbox.size(1) >= ids.size(0) && outbox.stride(1) == 1, ShapeError, op,
                   "outbox shape ", outbox.shape(), " must be [R >= 1, >= ", ids.size(0), "] with rows contiguous");
    MICROLLM_CHECK(counter.size(0) == 1, ShapeError, op, "counter shape ", counter.shape(), " must be [1]");
  }
  if (inputs.size(1) == 0 && (!hand_over || ids.size(0) == 0)) return;
  backend_for(inputs.device()).paged_decode_advance(inputs, block_tables, block_size, ids, outbox, counter);
}

}  // namespace microllm
