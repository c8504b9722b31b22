// Paged KV cache: paged_attention against the ordinary attention() over each sequence's contiguous keys
// (causal with q_offset) for shuffled, non-contiguous block tables, sequences of different lengths, chunks
// of several query tokens and decode steps, padding rows, GQA, D 64 / 128 / odd, every pool dtype, fresh
// random inputs and NaN-filled outputs; paged_kv_write -> paged_gather round trips; bad indices; contract
// errors. On CUDA: parity with the CPU at the shapes of Qwen2.5-0.5B and R1-Distill-1.5B (batch up to 32,
// contexts up to ~4000, a max_context above the actual lengths) without any host <-> device transfer.
#include "microllm/ops/paged_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/environment.h"
#include "microllm/backend/kernel_choices.h"
#include "microllm/core/cuda.h"
#include "microllm/ops/attention.h"
#include "microllm/ops/elementwise.h"
#include "microllm/ops/matmul.h"
#include "microllm/ops/qk_norm.h"
#include "microllm/ops/rope.h"
#include "test_support.h"

#ifdef MICROLLM_WITH_CUDA
#include "backend/cuda/paged_attention.h"
#endif

namespace microllm {
namespace {

using testing::host_values;
using testing::llama3_interleaved_rope;
using testing::qwen_rope;
using testing::random_tensor;
using testing::tolerance;

const DType kPoolTypes[] = {DType::f32, DType::bf16, DType::f16};

// The pool dtypes `device` takes: f64 too on the CPU (the engine tests' exact comparisons).
std::vector<DType> pool_types(Device device) {
  std::vector<DType> types(std::begin(kPoolTypes), std::end(kPoolTypes));
  if (device.is_cpu()) types.push_back(DType::f64);
  return types;
}

// A cache of several sequences in shuffled blocks, and a batch of query rows over them.
struct Cache {
  int64_t num_blocks, block_size, kv_heads, dim, q_heads, max_blocks;
  std::vector<int64_t> lengths;             // tokens cached per sequence
  std::vector<int32_t> tables;              // [S, max_blocks]; -1 past a sequence's blocks (never read)
  std::vector<int32_t> seq, pos;            // per query row; pos -1 = padding
  std::vector<int32_t> slots;               // per cached token of every sequence, in sequence order
  Tensor block_tables, seq_ids, positions;  // on the test's device
};

// Sequences of the given lengths in a pool with `spare` blocks more than they need, blocks assigned in a
// random order; `queries` tokens per sequence at its last positions (a prefill chunk, or 1 for decode),
// plus a padding row after every sequence's queries when `padding`. The block table has room for at least
// min_capacity tokens.
Cache make_cache(std::vector<int64_t> lengths, int64_t block_size, int64_t kv_heads, int64_t q_heads, int64_t dim,
                 int64_t queries, bool padding, Device device, int64_t spare = 3, int64_t min_capacity = 0) {
  Cache c;
  c.block_size = block_size;
  c.kv_heads = kv_heads;
  c.q_heads = q_heads;
  c.dim = dim;
  c.lengths = lengths;
  int64_t needed = 0, max_blocks = 1;
  for (int64_t len : lengths) {
    needed += (len + block_size - 1) / block_size;
    max_blocks = std::max(max_blocks, (len + block_size - 1) / block_size);
  }
  // One entry more than any sequence uses (or enough for min_capacity tokens): the rest stays -1.
  c.max_blocks = std::max(max_blocks + 1, (min_capacity + block_size - 1) / block_size);
  c.num_blocks = needed + spare;
  std::vector<int32_t> order(static_cast<size_t>(c.num_blocks));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(testing::fresh_seed());
  std::shuffle(order.begin(), order.end(), rng);
  c.tables.assign(static_cast<size_t>(lengths.size() * c.max_blocks), -1);
  size_t next = 0;
  for (size_t s = 0; s < lengths.size(); ++s) {
    for (int64_t b = 0; b * block_size < lengths[s]; ++b) c.tables[s * c.max_blocks + b] = order[next++];
    for (int64_t j = 0; j < lengths[s]; ++j) {
      c.slots.push_back(c.tables[s * c.max_blocks + j / block_size] * static_cast<int32_t>(block_size) +
                        static_cast<int32_t>(j % block_size));
    }
    for (int64_t t = std::min(queries, lengths[s]); t > 0; --t) {
      c.seq.push_back(static_cast<int32_t>(s));
      c.pos.push_back(static_cast<int32_t>(lengths[s] - t));
    }
    if (padding) {
      c.seq.push_back(static_cast<int32_t>((s * 7) % lengths.size()));  // any value: padding rows ignore it
      c.pos.push_back(-1);
    }
  }
  c.block_tables = Tensor::from_vector(c.tables, {static_cast<int64_t>(lengths.size()), c.max_blocks}).to(device);
  c.seq_ids = Tensor::from_vector(c.seq, {static_cast<int64_t>(c.seq.size())}).to(device);
  c.positions = Tensor::from_vector(c.pos, {static_cast<int64_t>(c.pos.size())}).to(device);
  return c;
}

int64_t rows(const Cache& c) { return static_cast<int64_t>(c.seq.size()); }

// The expected output of every query row: attention() over the sequence's contiguous keys, causal with
// q_offset = the row's position (one row at a time) and the sliding window, or zeros for padding. k_seq[s], v_seq[s]
// [L, Hkv, D].
std::vector<double> expected_output(const Cache& c, const Tensor& q, const std::vector<Tensor>& k_seq,
                                    const std::vector<Tensor>& v_seq, double scale, int64_t window = 0) {
  std::vector<double> out;
  for (int64_t n = 0; n < rows(c); ++n) {
    if (c.pos[n] < 0) {
      out.insert(out.end(), static_cast<size_t>(c.q_heads * c.dim), 0.0);
      continue;
    }
    const Tensor qn = q.narrow(0, n, 1).unsqueeze(0).transpose(1, 2);  // [1, Hq, 1, D]
    const Tensor k = k_seq[c.seq[n]].unsqueeze(0).transpose(1, 2);     // [1, Hkv, L, D]
    const Tensor v = v_seq[c.seq[n]].unsqueeze(0).transpose(1, 2);
    AttentionParams p;
    p.scale = scale;
    p.q_offset = c.pos[n];
    p.window = window;
    const std::vector<double> row = host_values(attention(qn, k, v, p).out);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

class PagedAttentionTest : public testing::DeviceTest {
 protected:
  // Writes random keys/values of every sequence through paged_kv_write (k, v as [L, Hkv, D] views of a
  // [1, L, Hkv, D] buffer), then checks paged_attention on NaN-filled outputs against attention().
  void check(Cache c, DType dtype, double scale, const char* what, int64_t window = 0) {
    SCOPED_TRACE(std::string(what) + " " + dtype_name(dtype) + " window " + std::to_string(window));
    const Device cpu = Device::cpu();
    const Tensor k_pool = random_tensor({c.num_blocks, c.block_size, c.kv_heads, c.dim}, dtype, device());
    const Tensor v_pool = random_tensor({c.num_blocks, c.block_size, c.kv_heads, c.dim}, dtype, device());
    std::vector<Tensor> k_seq, v_seq;  // on the CPU, for the reference
    size_t first_slot = 0;
    for (int64_t len : c.lengths) {
      // f32 values written into a pool of another dtype: the reference sees them rounded the same way.
      const Tensor k = random_tensor({1, len, c.kv_heads, c.dim}, DType::f32, device()).select(0, 0);
      const Tensor v = testing::non_contiguous(random_tensor({len, c.kv_heads, c.dim}, DType::f32, device()));
      const std::vector<int32_t> s(c.slots.begin() + first_slot, c.slots.begin() + first_slot + len);
      first_slot += static_cast<size_t>(len);
      paged_kv_write(k_pool, v_pool, k, v, Tensor::from_vector(s, {len}).to(device()));
      k_seq.push_back(k.to(cpu).to(dtype));
      v_seq.push_back(v.to(cpu).to(dtype));
    }
    const Tensor q = testing::non_contiguous(random_tensor({rows(c), c.q_heads, c.dim}, dtype, device(), -2, 2));
    const std::vector<double> want = expected_output(c, q.to(cpu), k_seq, v_seq, scale, window);

    const Tensor got = paged_attention(q, k_pool, v_pool, c.block_tables, c.seq_ids, c.positions, scale, 0, window);
    ASSERT_EQ(got.shape(), q.shape());
    ASSERT_EQ(got.dtype(), dtype);
    MICROLLM_EXPECT_CLOSE(got, want, tolerance(dtype));

    // Into a NaN-filled buffer, with a max_context above every length: every element written, the same values.
    const Tensor out = Tensor::full(q.shape(), NAN, dtype, device());
    const int64_t longest = *std::max_element(c.lengths.begin(), c.lengths.end());
    paged_attention(q, k_pool, v_pool, c.block_tables, c.seq_ids, c.positions, scale,
                    std::min(longest + 37, c.max_blocks * c.block_size), out, window);
    const std::vector<double> values = host_values(out);
    for (size_t i = 0; i < values.size(); ++i) ASSERT_TRUE(std::isfinite(values[i])) << "element " << i;
    MICROLLM_EXPECT_CLOSE(out, want, tolerance(dtype));
    for (int64_t n = 0; n < rows(c); ++n) {
      if (c.pos[n] >= 0) continue;
      for (double x : host_values(out.select(0, n))) ASSERT_EQ(x, 0.0) << "padding row " << n;
    }
  }
};

TEST_P(PagedAttentionTest, ChunksAndDecodeMatchContiguousAttention) {
  for (DType dtype : kPoolTypes) {
    // GQA 6/2, odd block size, lengths that end mid-block, exactly on a block and inside the first block.
    check(make_cache({37, 20, 5, 64}, 5, 2, 6, 64, 4, true, device()), dtype, 0, "chunks d64");
    check(make_cache({37, 20, 5, 64}, 5, 2, 6, 64, 1, true, device()), dtype, 0.3, "decode d64 scale 0.3");
    check(make_cache({70, 1, 33}, 16, 2, 12, 128, 1, false, device()), dtype, 0, "decode d128 group 6");
    check(make_cache({9, 40}, 8, 1, 3, 128, 7, true, device()), dtype, 0, "chunks d128 MQA");
    check(make_cache({13, 26, 3}, 4, 3, 3, 24, 3, true, device()), dtype, 0, "chunks d24 MHA");
    // Sliding windows: one key, a window ending mid-block, one longer than some sequences.
    for (int64_t window : {1, 7, 40}) {
      check(make_cache({37, 20, 5, 64}, 5, 2, 6, 64, 4, true, device()), dtype, 0, "chunks d64", window);
      check(make_cache({70, 1, 33}, 16, 2, 12, 128, 1, false, device()), dtype, 0, "decode d128 group 6", window);
    }
    // Windows past one chunk over long sequences: the staged kernel's splits start at the window's first key.
    check(make_cache({1500, 700, 37}, 16, 2, 14, 64, 1, true, device()), dtype, 0, "decode long, window 900", 900);
    check(make_cache({1500, 9}, 16, 1, 4, 256, 1, false, device()), dtype, 0, "decode d256 MQA, window 512", 512);
  }
}

// The Qwen2.5-0.5B decode shape at a few hundred tokens, against the CPU on both devices.
TEST_P(PagedAttentionTest, QwenDecodeBatch) {
  check(make_cache({300, 17, 129, 256, 1, 64, 200, 95}, 16, 2, 14, 64, 1, true, device()), DType::bf16, 0,
        "qwen decode");
}

TEST_P(PagedAttentionTest, WriteThenGatherRoundTripsAndSkipSlotsLeaveThePoolAlone) {
  for (DType dtype : pool_types(device())) {
    SCOPED_TRACE(dtype_name(dtype));
    const Cache c = make_cache({11, 30}, 4, 2, 2, 16, 1, false, device());
    const Tensor k_pool = random_tensor({c.num_blocks, c.block_size, c.kv_heads, c.dim}, dtype, device());
    const Tensor v_pool = random_tensor({c.num_blocks, c.block_size, c.kv_heads, c.dim}, dtype, device());
    const std::vector<double> k_before = host_values(k_pool), v_before = host_values(v_pool);
    // Sequence 1's 30 tokens as a [2, 16, Hkv, D] projection (the last two rows padding), f64 source
    // values converted to the pool's dtype; the padding rows' slots are -1. A third of uniform (f32) draws:
    // values an f64 pool holds and an f32 one would round.
    auto source = [&] { return scale(random_tensor({2, 16, c.kv_heads, c.dim}, DType::f64), 1.0 / 3).to(device()); };
    const Tensor k = source();
    const Tensor v = source().transpose(2, 3).contiguous().transpose(2, 3);  // D strided
    std::vector<int32_t> slots(c.slots.begin() + 11, c.slots.end());
    slots.push_back(-1);
    slots.push_back(-1);
    paged_kv_write(k_pool, v_pool, k.view({32, c.kv_heads, c.dim}), v.reshape({32, c.kv_heads, c.dim}),
                   Tensor::from_vector(slots, {32}).to(device()));
    const Tensor row = c.block_tables.select(0, 1);
    const Tensor k_back = paged_gather(k_pool, row, 30), v_back = paged_gather(v_pool, row, 30);
    ASSERT_EQ(k_back.shape(), (Shape{30, c.kv_heads, c.dim}));
    EXPECT_EQ(host_values(k_back), host_values(k.reshape({32, c.kv_heads, c.dim}).narrow(0, 0, 30).to(dtype)));
    EXPECT_EQ(host_values(v_back), host_values(v.reshape({32, c.kv_heads, c.dim}).narrow(0, 0, 30).to(dtype)));
    // Every slot that is not one of sequence 1's 30 is untouched (the skip rows wrote nothing).
    std::vector<bool> written(static_cast<size_t>(c.num_blocks * c.block_size), false);
    for (size_t i = 11; i < c.slots.size(); ++i) written[static_cast<size_t>(c.slots[i])] = true;
    const std::vector<double> k_after = host_values(k_pool), v_after = host_values(v_pool);
    const size_t per_slot = static_cast<size_t>(c.kv_heads * c.dim);
    for (size_t e = 0; e < k_after.size(); ++e) {
      if (written[e / per_slot]) continue;
      ASSERT_EQ(k_after[e], k_before[e]) << "k_pool element " << e;
      ASSERT_EQ(v_after[e], v_before[e]) << "v_pool element " << e;
    }
    // A gather of a shorter prefix, from a strided block table row (column 0 of a transposed table).
    const Tensor transposed = c.block_tables.t().contiguous().t();
    EXPECT_EQ(host_values(paged_gather(k_pool, transposed.select(0, 1), 5)), host_values(k_back.narrow(0, 0, 5)));
    EXPECT_EQ(paged_gather(k_pool, row, 0).numel(), 0);
  }
}

TEST_P(PagedAttentionTest, BadIndicesAreIndexErrors) {
  const Cache c = make_cache({10, 6}, 4, 1, 2, 8, 1, false, device(), 0);
  const Tensor k_pool = random_tensor({c.num_blocks, c.block_size, 1, 8}, DType::f32, device());
  const Tensor v_pool = random_tensor({c.num_blocks, c.block_size, 1, 8}, DType::f32, device());
  const Tensor q = random_tensor({2, 2, 8}, DType::f32, device());
  auto i32 = [&](std::vector<int32_t> v, Shape s) { return Tensor::from_vector(v, s).to(device()); };
  auto error = [&](const std::function<void()>& call) { return testing::index_error_message(device(), call); };
  const Tensor kv = random_tensor({1, 1, 8}, DType::f32, device());
  const std::string slot =
      error([&] { paged_kv_write(k_pool, v_pool, kv, kv, i32({int32_t(c.num_blocks * 4)}, {1})); });
  EXPECT_NE(slot.find("paged_kv_write"), std::string::npos) << slot;
  const Tensor bad_table = i32({0, 1, 2, 99, 4, 5}, {2, 3});
  const std::string block = error([&] {
    paged_attention(q, k_pool, v_pool, bad_table, i32({0, 1}, {2}), i32({9, 5}, {2}));
  });
  EXPECT_NE(block.find("paged_attention"), std::string::npos) << block;
  const std::string seq = error([&] {
    paged_attention(q, k_pool, v_pool, c.block_tables, i32({0, 2}, {2}), c.positions);
  });
  EXPECT_NE(seq.find("paged_attention"), std::string::npos) << seq;
  const std::string pos =
      error([&] { paged_attention(q, k_pool, v_pool, c.block_tables, c.seq_ids, c.positions, 0, 9); });
  EXPECT_NE(pos.find("max_context"), std::string::npos) << pos;
  const std::string gather = error([&] { paged_gather(k_pool, bad_table.select(0, 1), 12); });
  EXPECT_NE(gather.find("paged_gather"), std::string::npos) << gather;
  // Entries past what a sequence needs are never read: -1 there is fine.
  EXPECT_EQ(error([&] { paged_gather(k_pool, i32({0, -1, -1}, {3}), 4); }), "");
}

TEST_P(PagedAttentionTest, ContractErrorsNameTheOpAndTheArgument) {
  auto t = [&](Shape shape, DType dtype = DType::f32) { return random_tensor(shape, dtype, device()); };
  auto i32 = [&](Shape shape) { return Tensor::zeros(shape, DType::i32, device()); };
  const Tensor kp = t({4, 8, 2, 16}), vp = t({4, 8, 2, 16}), q = t({3, 4, 16});
  const Tensor bt = i32({2, 4}), ids = i32({3}), pos = i32({3});
  const auto message = testing::error_message;
  auto expect = [&](const std::string& m, const char* op, const char* arg) {
    EXPECT_NE(m.find(std::string("[") + op + "]"), std::string::npos) << m;
    EXPECT_NE(m.find(arg), std::string::npos) << m;
  };
  // paged_attention
  expect(message([&] { paged_attention(t({3, 4}), kp, vp, bt, ids, pos); }), "paged_attention", "q");
  expect(message([&] { paged_attention(t({3, 4, 8}), kp, vp, bt, ids, pos); }), "paged_attention", "head dim");
  expect(message([&] { paged_attention(t({3, 3, 16}), kp, vp, bt, ids, pos); }), "paged_attention", "kv heads");
  expect(message([&] { paged_attention(t({3, 4, 16}, DType::bf16), kp, vp, bt, ids, pos); }), "paged_attention", "q");
  expect(message([&] { paged_attention(q, kp, t({4, 8, 2, 8}), bt, ids, pos); }), "paged_attention", "v_pool");
  expect(message([&] {
           paged_attention(q, kp, t({4, 8, 2, 16}, DType::f16), bt, ids, pos);
         }),
         "paged_attention", "v_pool");
  if (device().is_cuda()) {  // f64 pools are the CPU reference's only
    expect(message([&] {
             paged_attention(t({3, 4, 16}, DType::f64), t({4, 8, 2, 16}, DType::f64), t({4, 8, 2, 16}, DType::f64), bt,
                             ids, pos);
           }),
           "paged_attention", "k_pool");
  }
  expect(message([&] { paged_attention(q, t({4, 8, 32}), t({4, 8, 32}), bt, ids, pos); }), "paged_attention", "k_pool");
  expect(message([&] {
           paged_attention(q, kp, vp, Tensor::zeros({2, 4}, DType::i64, device()), ids, pos);
         }),
         "paged_attention", "block_tables");
  expect(message([&] { paged_attention(q, kp, vp, i32({8}), ids, pos); }), "paged_attention", "block_tables");
  expect(message([&] { paged_attention(q, kp, vp, bt, i32({2}), pos); }), "paged_attention", "seq_ids");
  expect(message([&] { paged_attention(q, kp, vp, bt, ids, t({3})); }), "paged_attention", "positions");
  expect(message([&] { paged_attention(q, kp, vp, bt, ids, i32({3, 1})); }), "paged_attention", "positions");
  expect(message([&] { paged_attention(q, kp, vp, bt, ids, pos, 0, 33); }), "paged_attention", "max_context");
  expect(message([&] { paged_attention(q, kp, vp, bt, ids, pos, NAN); }), "paged_attention", "scale");
  expect(message([&] { paged_attention(q, kp, vp, bt, ids, pos, 0, 0, t({3, 4, 8})); }), "paged_attention", "out");
  expect(message([&] {
           paged_attention(q, kp, vp, bt, ids, pos, 0, 0, t({3, 4, 16}, DType::f16));
         }),
         "paged_attention", "out");
  expect(message([&] {
           paged_attention(q, kp, vp, bt, ids, pos, 0, 0, t({3, 16, 4}).transpose(1, 2));
         }),
         "paged_attention", "out");
  // paged_kv_write
  const Tensor k = t({5, 2, 16}), slots = i32({5});
  expect(message([&] { paged_kv_write(kp, vp, t({5, 2, 8}), t({5, 2, 8}), slots); }), "paged_kv_write", "k");
  expect(message([&] { paged_kv_write(kp, vp, k, t({5, 2, 15}), slots); }), "paged_kv_write", "v");
  expect(message([&] { paged_kv_write(kp, vp, k, k, i32({4})); }), "paged_kv_write", "slots");
  expect(message([&] { paged_kv_write(kp, vp, k, k, t({5})); }), "paged_kv_write", "slots");
  expect(message([&] { paged_kv_write(kp, vp, i32({5, 2, 16}), k, slots); }), "paged_kv_write", "k");
  expect(message([&] { paged_kv_write(kp, t({4, 8, 2, 16}, DType::bf16), k, k, slots); }), "paged_kv_write", "v_pool");
  // paged_gather
  expect(message([&] { paged_gather(kp, i32({4}), 33); }), "paged_gather", "length");
  expect(message([&] { paged_gather(kp, i32({4}), -1); }), "paged_gather", "length");
  expect(message([&] { paged_gather(kp, i32({1, 4}), 3); }), "paged_gather", "block_table_row");
  expect(message([&] { paged_gather(kp, Tensor::zeros({4}, DType::i64, device()), 3); }), "paged_gather",
         "block_table_row");
  expect(message([&] { paged_gather(t({8, 2, 16}), i32({4}), 3); }), "paged_gather", "pool");
  // Devices: every argument on the other device than the pools.
  if (device().is_cuda()) {
    const Device cpu = Device::cpu();
    expect(message([&] { paged_attention(q.to(cpu), kp, vp, bt, ids, pos); }), "paged_attention", "q");
    expect(message([&] { paged_attention(q, kp, vp.to(cpu), bt, ids, pos); }), "paged_attention", "v_pool");
    expect(message([&] { paged_attention(q, kp, vp, bt.to(cpu), ids, pos); }), "paged_attention", "block_tables");
    expect(message([&] { paged_attention(q, kp, vp, bt, ids.to(cpu), pos); }), "paged_attention", "seq_ids");
    expect(message([&] { paged_attention(q, kp, vp, bt, ids, pos.to(cpu)); }), "paged_attention", "positions");
    expect(message([&] { paged_attention(q, kp, vp, bt, ids, pos, 0, 0, Tensor::empty(q.shape(), DType::f32, cpu)); }),
           "paged_attention", "out");
    expect(message([&] { paged_kv_write(kp, vp, k.to(cpu), k, slots); }), "paged_kv_write", "k");
    expect(message([&] { paged_kv_write(kp, vp, k, k, slots.to(cpu)); }), "paged_kv_write", "slots");
    expect(message([&] { paged_gather(kp, i32({4}).to(cpu), 3); }), "paged_gather", "block_table_row");
  }
}

// ---- paged_decode_attention: the fused decode step against the ops it stands for ----

// One decode step over a cache: q, k, v of every query row as views of one fused QKV projection (before the
// rotation), and each row's slot (its position's slot in its sequence's blocks; -1 for padding).
struct DecodeStep {
  Tensor qkv, q, k, v, slots;
};
// The step over a given QKV projection [rows, (Hq + 2 Hkv) * D] and slots: q, k, v as its views.
DecodeStep step_of(const Cache& c, const Tensor& qkv, const Tensor& slots) {
  const int64_t n = rows(c), d = c.dim;
  return {qkv, qkv.narrow(1, 0, c.q_heads * d).view({n, c.q_heads, d}),
          qkv.narrow(1, c.q_heads * d, c.kv_heads * d).view({n, c.kv_heads, d}),
          qkv.narrow(1, (c.q_heads + c.kv_heads) * d, c.kv_heads * d).view({n, c.kv_heads, d}), slots};
}
DecodeStep make_step(const Cache& c, DType dtype, Device device) {
  const int64_t n = rows(c);
  const Tensor qkv = random_tensor({n, (c.q_heads + 2 * c.kv_heads) * c.dim}, dtype, device, -2, 2);
  std::vector<int32_t> slots;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t pos = c.pos[r];
    slots.push_back(pos < 0
                        ? -1
                        : c.tables[c.seq[r] * c.max_blocks + pos / c.block_size] * static_cast<int32_t>(c.block_size) +
                              static_cast<int32_t>(pos % c.block_size));
  }
  return step_of(c, qkv, Tensor::from_vector(slots, {n}).to(device));
}

// On this device: paged_decode_attention into a NaN-filled out on random pools, against rope + paged_kv_write +
// paged_attention on copies of the same pools. The same device's kernels see the same numbers, so both the
// output and the pools must be identical, bit for bit.
void check_decode_equals_composition(const Cache& c, DType dtype, const RopeParams& rope, int64_t max_context,
                                     Device device, const char* what, int64_t window = 0) {
  SCOPED_TRACE(std::string(what) + " " + dtype_name(dtype) + " window " + std::to_string(window));
  const Tensor k_pool = random_tensor({c.num_blocks, c.block_size, c.kv_heads, c.dim}, dtype, device);
  const Tensor v_pool = random_tensor({c.num_blocks, c.block_size, c.kv_heads, c.dim}, dtype, device);
  const Tensor k_ref = k_pool.clone(), v_ref = v_pool.clone();
  const DecodeStep s = make_step(c, dtype, device);
  const Tensor pos = c.positions.unsqueeze(1);  // rope's [B, T]
  const Tensor q_rot = microllm::rope(s.q.unsqueeze(1), pos, rope).select(1, 0);
  const Tensor k_rot = microllm::rope(s.k.unsqueeze(1), pos, rope).select(1, 0);
  paged_kv_write(k_ref, v_ref, k_rot, s.v, s.slots);
  const Tensor want =
      paged_attention(q_rot, k_ref, v_ref, c.block_tables, c.seq_ids, c.positions, 0, max_context, window);

  const Tensor out = Tensor::full(s.q.shape(), NAN, dtype, device);
  paged_decode_attention(s.q, s.k, s.v, rope, k_pool, v_pool, s.slots, c.block_tables, c.seq_ids, c.positions, 0,
                         max_context, out, window);
  EXPECT_EQ(host_values(out), host_values(want));
  EXPECT_EQ(host_values(k_pool), host_values(k_ref));
  EXPECT_EQ(host_values(v_pool), host_values(v_ref));
}

TEST_P(PagedAttentionTest, DecodeAttentionIsRopeWriteAndAttention) {
  const Device d = device();
  for (DType dtype : kPoolTypes) {
    // Qwen2.5-0.5B heads, padding rows, one split (max_context 256) and several (2048).
    const Cache qwen = make_cache({300, 17, 129, 1, 64, 200}, 16, 2, 14, 64, 1, true, d, 3, 2048);
    check_decode_equals_composition(qwen, dtype, qwen_rope(), 2048, d, "qwen, splits");
    const Cache short_qwen = make_cache({30, 1, 129, 256}, 16, 2, 14, 64, 1, true, d);
    check_decode_equals_composition(short_qwen, dtype, qwen_rope(), 256, d, "qwen, one split");
    // R1-Distill-1.5B heads (D 128), llama3 scaling with interleaved pairs, a group of 16 (two row blocks).
    check_decode_equals_composition(make_cache({70, 1, 33, 500}, 16, 2, 12, 128, 1, false, d), dtype, qwen_rope(), 0, d,
                                    "r1");
    check_decode_equals_composition(make_cache({40, 77}, 8, 2, 8, 64, 1, false, d), dtype, llama3_interleaved_rope(), 0,
                                    d, "llama3 interleaved");
    check_decode_equals_composition(make_cache({300, 17}, 16, 2, 32, 64, 1, true, d), dtype, qwen_rope(), 0, d,
                                    "group 16");
    // A head dim the fast kernel does not take (CUDA runs the separate ops).
    check_decode_equals_composition(make_cache({50, 3}, 4, 3, 6, 40, 1, true, d), dtype, qwen_rope(), 0, d, "d40");
    // Sliding windows: within one chunk, and past it over the splits.
    check_decode_equals_composition(short_qwen, dtype, qwen_rope(), 256, d, "qwen, window 48", 48);
    check_decode_equals_composition(qwen, dtype, qwen_rope(), 2048, d, "qwen, splits, window 150", 150);
    check_decode_equals_composition(qwen, dtype, qwen_rope(), 2048, d, "qwen, splits, window 1100", 1100);
  }
  // A slot that is not the position's: an IndexError (on CUDA at the next synchronization).
  const Cache c = make_cache({40, 7}, 16, 2, 14, 64, 1, false, d);
  const DecodeStep s = make_step(c, DType::bf16, d);
  const Tensor k_pool = Tensor::zeros({c.num_blocks, 16, 2, 64}, DType::bf16, d), v_pool = k_pool.clone();
  std::vector<int32_t> slots = {0, 0};
  slots[0] = static_cast<int32_t>(host_values(s.slots)[0]) + 1;
  slots[1] = static_cast<int32_t>(host_values(s.slots)[1]);
  const std::string message = testing::index_error_message(d, [&] {
    paged_decode_attention(s.q, s.k, s.v, qwen_rope(), k_pool, v_pool, Tensor::from_vector(slots, {2}).to(d),
                           c.block_tables, c.seq_ids, c.positions, 0, 0, Tensor::empty(s.q.shape(), DType::bf16, d));
  });
  EXPECT_NE(message.find("slot"), std::string::npos) << message;
}

// ---- paged_decode_attention_projected: the decode step and the o projection against the two ops ----

// The reference result of paged_decode_attention_projected for step s over the pools (before the step's write):
// the same inputs widened to f32 (the pools copied: the op writes them), through the CPU's paged_decode_attention and
// linear_add. f32, not f64: the rotary angles are computed in f32 on every path (as transformers does), so an f64
// reference would differ from an f32 result by their rounding (up to ~1e-5 where the outputs are small).
std::vector<double> reference_projected(const Cache& c, const DecodeStep& s, const Tensor& k_pool, const Tensor& v_pool,
                                        const Tensor& o_weight, const Tensor& addend, int64_t max_context,
                                        int64_t window) {
  const Device cpu = Device::cpu();
  auto wide = [&](const Tensor& t) { return t.to(cpu).to(DType::f32); };
  const DecodeStep w = step_of(c, wide(s.qkv), s.slots.to(cpu));
  const Tensor attention = Tensor::empty(w.q.shape(), DType::f32, cpu);
  paged_decode_attention(w.q, w.k, w.v, qwen_rope(), wide(k_pool).clone(), wide(v_pool).clone(), w.slots,
                         c.block_tables.to(cpu), c.seq_ids.to(cpu), c.positions.to(cpu), 0, max_context, attention,
                         window);
  return host_values(linear_add(attention.reshape({rows(c), c.q_heads * c.dim}), wide(o_weight), Tensor(),
                                addend.defined() ? wide(addend) : Tensor()));
}

// On this device: paged_decode_attention_projected into a NaN-filled out on random pools, and the composition it
// stands for (paged_decode_attention on copies of the pools, then linear_add with the same o_weight and addend;
// undefined: none), each within the dtype's tolerance of the f32 reference. In 16-bit dtypes, where rounding to
// the dtype dominates both errors, the fused path may also be at most twice as far from the reference as the
// composition (plus 1% of the tolerance): a lost key or a column summed twice costs more. The two are not compared
// with each other: they round differently (the fused kernels keep the attention in f32 for the projection and sum
// in their own orders, some on the tensor cores), so their difference is two rounding errors, not a bug. The pools
// must match bit for bit: the new k and v are rounded once, the same way.
void check_projected_matches_reference(const Cache& c, DType dtype, int64_t hidden, bool with_addend,
                                       int64_t max_context, Device device, const char* what, int64_t window = 0) {
  SCOPED_TRACE(std::string(what) + " " + dtype_name(dtype) + (with_addend ? " with addend" : "") + " window " +
               std::to_string(window));
  const Tensor k_pool = random_tensor({c.num_blocks, c.block_size, c.kv_heads, c.dim}, dtype, device);
  const Tensor v_pool = random_tensor({c.num_blocks, c.block_size, c.kv_heads, c.dim}, dtype, device);
  const Tensor k_ref = k_pool.clone(), v_ref = v_pool.clone();
  const DecodeStep s = make_step(c, dtype, device);
  const int64_t n = rows(c);
  const Tensor o_weight = random_tensor({hidden, c.q_heads * c.dim}, dtype, device, -0.1, 0.1);
  const Tensor addend = with_addend ? random_tensor({n, hidden}, dtype, device) : Tensor();
  const std::vector<double> reference =
      reference_projected(c, s, k_pool, v_pool, o_weight, addend, max_context, window);
  const Tensor attention = Tensor::full(s.q.shape(), NAN, dtype, device);
  paged_decode_attention(s.q, s.k, s.v, qwen_rope(), k_ref, v_ref, s.slots, c.block_tables, c.seq_ids, c.positions, 0,
                         max_context, attention, window);
  const Tensor composition = linear_add(attention.reshape({n, c.q_heads * c.dim}), o_weight, Tensor(), addend);

  const Tensor out = Tensor::full({n, hidden}, NAN, dtype, device);
  paged_decode_attention_projected(s.q, s.k, s.v, qwen_rope(), k_pool, v_pool, s.slots, c.block_tables, c.seq_ids,
                                   c.positions, 0, max_context, o_weight, addend, out, window);
  const double composition_error = testing::relative_error(composition, reference);
  const double fused_error = testing::relative_error(out, reference);
  EXPECT_LE(composition_error, tolerance(dtype));
  EXPECT_LE(fused_error, tolerance(dtype));
  if (dtype != DType::f32) {
    EXPECT_LE(fused_error, 2 * composition_error + tolerance(dtype) / 100) << "composition: " << composition_error;
  }
  EXPECT_EQ(host_values(k_pool), host_values(k_ref));
  EXPECT_EQ(host_values(v_pool), host_values(v_ref));
}

// The long-context cases of DecodeAttentionProjectedIsAttentionThenLinear, run by CUDA through each of its fused
// paths past one split.
void check_long_context_projected(DType dtype, bool with_addend, Device d) {
  // Past one split (a long context): one token, two, one with a padding row.
  check_projected_matches_reference(make_cache({1500}, 16, 2, 14, 64, 1, false, d, 3, 2048), dtype, 896, with_addend,
                                    2048, d, "long context b1");
  check_projected_matches_reference(make_cache({600, 1800}, 16, 2, 14, 64, 1, false, d, 3, 2048), dtype, 896,
                                    with_addend, 2048, d, "long context b2");
  check_projected_matches_reference(make_cache({900, 2040}, 16, 2, 14, 64, 1, false, d, 3, 4096), dtype, 896,
                                    with_addend, 4096, d, "long context b2, 4096-key graph");
  check_projected_matches_reference(make_cache({700}, 16, 2, 14, 64, 1, true, d, 3, 1024), dtype, 900, with_addend,
                                    1024, d, "long context + padding, hidden 900");
  // A 4,096-key graph: the target workload's steps (two tokens past prompts of 2,048), one token at hidden 900 (the
  // last column blocks short or empty), and one token of 10 keys (most slices empty).
  check_projected_matches_reference(make_cache({2100, 2111}, 16, 2, 14, 64, 1, false, d, 3, 4096), dtype, 896,
                                    with_addend, 4096, d, "workload b2, 4096-key graph");
  check_projected_matches_reference(make_cache({3000}, 16, 2, 14, 64, 1, false, d, 3, 4096), dtype, 900, with_addend,
                                    4096, d, "b1, 4096-key graph, hidden 900");
  check_projected_matches_reference(make_cache({9}, 16, 2, 14, 64, 1, false, d, 3, 4096), dtype, 896, with_addend, 4096,
                                    d, "b1 of 10 keys, 4096-key graph");
  // R1-Distill-1.5B's heads (12 of D 128 over 2 kv heads, hidden 1536), a sequence far shorter than max_context.
  check_projected_matches_reference(make_cache({333}, 16, 2, 12, 128, 1, false, d, 3, 2048), dtype, 1536, with_addend,
                                    2048, d, "r1 long context b1");
}

TEST_P(PagedAttentionTest, DecodeAttentionProjectedIsAttentionThenLinear) {
  const Device d = device();
#ifdef MICROLLM_WITH_CUDA
  namespace pg = cuda_kernels::paged;
  const int64_t launches_before = d.is_cuda() ? pg::projected_launches() : 0;
  const int64_t clusters_before = d.is_cuda() ? pg::token_cluster_launches() : 0;
  const int64_t head_clusters_before = d.is_cuda() ? pg::head_cluster_launches() : 0;
#endif
  for (DType dtype : kPoolTypes) {
    for (bool with_addend : {true, false}) {
      // Qwen2.5-0.5B's heads (14 query heads of D 64 over 2 kv heads, hidden 896) within one split, one token
      // and one token + a padding row: CUDA fuses these (and the two below) in 16-bit dtypes; on the H200's 132
      // SMs one token takes four clusters with o_weight's rows in shared memory, two tokens two clusters each
      // (the one-cluster paths, rows streamed through L2, run in tools/gpu/run.sh's tests step, forced).
      check_projected_matches_reference(make_cache({129}, 16, 2, 14, 64, 1, false, d, 3, 256), dtype, 896, with_addend,
                                        256, d, "qwen b1");
      check_projected_matches_reference(make_cache({200}, 16, 2, 14, 64, 1, true, d, 3, 256), dtype, 896, with_addend,
                                        256, d, "qwen b1 + padding");
      // A hidden size that the 14 heads do not divide (the last CTAs' columns are fewer or none), and a group of 4
      // (two tokens, each four clusters of 8 CTAs).
      check_projected_matches_reference(make_cache({77}, 8, 2, 14, 64, 1, false, d, 3, 256), dtype, 900, with_addend,
                                        256, d, "hidden 900");
      check_projected_matches_reference(make_cache({5, 64}, 16, 2, 8, 64, 1, false, d, 3, 128), dtype, 512, with_addend,
                                        128, d, "group 4");
      // Past one split, CUDA's three fused paths: a token's attention in one cluster (paged_token_cluster_kernel;
      // up to 4,096 keys, the tensor-core phases' 512-key slices), as the switches are; a cluster a kv head (its
      // kHeadClusters) for every case (token clusters off); the splits followed by one kernel merging them and
      // projecting (both off).
      check_long_context_projected(dtype, with_addend, d);
#ifdef MICROLLM_WITH_CUDA
      if (d.is_cuda()) {
        const testing::ScopedSwitch no_token_clusters(pg::token_clusters, pg::set_token_clusters, false);
        {
          const testing::ScopedSwitch head_clusters(pg::head_clusters, pg::set_head_clusters, true);
          check_long_context_projected(dtype, with_addend, d);
        }
        const testing::ScopedSwitch splits(pg::head_clusters, pg::set_head_clusters, false);
        check_long_context_projected(dtype, with_addend, d);
      }
#endif
    }
    // Declined by CUDA's fused kernels (the composition runs): several splits over four token rows; R1-1.5B's
    // o_weight (384 KB a CTA); four tokens.
    check_projected_matches_reference(make_cache({300, 17}, 16, 2, 14, 64, 1, true, d, 3, 2048), dtype, 896, true, 2048,
                                      d, "splits");
    check_projected_matches_reference(make_cache({70}, 16, 2, 12, 128, 1, false, d, 3, 256), dtype, 1536, true, 256, d,
                                      "r1");
    check_projected_matches_reference(make_cache({30, 200, 3, 64}, 16, 2, 14, 64, 1, false, d, 3, 256), dtype, 896,
                                      true, 256, d, "four tokens");
  }
#ifdef MICROLLM_WITH_CUDA
  // {bf16, f16} x 2 addends x (4 short cases + 8 long ones in each of the three runs), every one fused: a silent
  // fallback would pass the comparisons above without testing the kernels. Of the long ones, all but R1's take a
  // token's cluster as the switches are, and head clusters (up to two tokens, a padding row counted) with token
  // clusters off; R1's o_weight, past the clusters' budgets, takes the splits. (Not where
  // MICROLLM_ATTENTION_O_REPLICAS forces a replica count: tools/gpu/run.sh's tests step runs this test so, and
  // R1's rows fit no single replica; nor where MICROLLM_DISABLE=attention-o keeps the projection out.)
  if (d.is_cuda() && detail::attention_o_replicas_from_environment() == 0 &&
      !detail::path_disabled(detail::FastPath::attention_o)) {
    const bool token = pg::token_clusters(), head = pg::head_clusters();
    EXPECT_EQ(pg::projected_launches() - launches_before, 4 * (4 + 3 * 8));
    EXPECT_EQ(pg::token_cluster_launches() - clusters_before, token ? 4 * 7 : 0);
    EXPECT_EQ(pg::head_cluster_launches() - head_clusters_before, 4 * ((head && !token ? 7 : 0) + 7));
  }
#endif
  // Sliding windows over long sequences (Gemma 3's and Mistral's layers): CUDA's fused kernels start at the window's
  // first key, one split where the window fits a chunk, a token's cluster or the splits past it.
  for (DType dtype : kPoolTypes) {
    check_projected_matches_reference(make_cache({1500}, 16, 2, 14, 64, 1, false, d, 3, 2048), dtype, 896, true, 2048,
                                      d, "b1, window 200", 200);
    check_projected_matches_reference(make_cache({600, 1800}, 16, 2, 14, 64, 1, true, d, 3, 2048), dtype, 896, true,
                                      2048, d, "b2 + padding, window 1000", 1000);
    check_projected_matches_reference(make_cache({2100, 40, 3000}, 16, 1, 4, 256, 1, false, d, 3, 4096), dtype, 640,
                                      false, 4096, d, "Gemma 3 270M heads, window 512", 512);
  }
}

TEST(PagedDecodeAttentionTest, ProjectedErrorsNameTheArgument) {
  const Device cpu = Device::cpu();
  const Cache c = make_cache({20, 9}, 4, 1, 2, 8, 1, false, cpu);
  const Tensor k_pool = random_tensor({c.num_blocks, c.block_size, 1, 8}, DType::f32, cpu);
  const Tensor v_pool = random_tensor({c.num_blocks, c.block_size, 1, 8}, DType::f32, cpu);
  const DecodeStep s = make_step(c, DType::f32, cpu);
  auto run = [&](const Tensor& o_weight, const Tensor& addend, const Tensor& out) {
    return testing::error_message([&] {
      paged_decode_attention_projected(s.q, s.k, s.v, qwen_rope(), k_pool, v_pool, s.slots, c.block_tables, c.seq_ids,
                                       c.positions, 0, 0, o_weight, addend, out);
    });
  };
  const Tensor w = random_tensor({24, 16}, DType::f32, cpu), out = Tensor::empty({2, 24}, DType::f32, cpu);
  const std::string weight = run(random_tensor({24, 15}, DType::f32, cpu), Tensor(), out);
  EXPECT_NE(weight.find("[paged_decode_attention_projected]"), std::string::npos) << weight;
  EXPECT_NE(weight.find("o_weight shape"), std::string::npos) << weight;
  const std::string wrong_out = run(w, Tensor(), Tensor::empty({2, 23}, DType::f32, cpu));
  EXPECT_NE(wrong_out.find("out must be [2, 24]"), std::string::npos) << wrong_out;
  const std::string wrong_addend = run(w, Tensor::empty({1, 24}, DType::f32, cpu), out);
  EXPECT_NE(wrong_addend.find("addend shape"), std::string::npos) << wrong_addend;
  const std::string dtype = run(random_tensor({24, 16}, DType::bf16, cpu), Tensor(), out);
  EXPECT_NE(dtype.find("o_weight"), std::string::npos) << dtype;
  EXPECT_EQ(run(w, Tensor(), out), "no error");
}

// The contract the fused kernel relies on is checked by the reference: slots, one row per sequence, padding.
TEST(PagedDecodeAttentionTest, ContractErrorsNameTheRow) {
  const Device cpu = Device::cpu();
  const Cache c = make_cache({20, 9}, 4, 1, 2, 8, 1, true, cpu);  // rows: seq 0, padding, seq 1, padding
  const Tensor k_pool = random_tensor({c.num_blocks, c.block_size, 1, 8}, DType::f32, cpu);
  const Tensor v_pool = random_tensor({c.num_blocks, c.block_size, 1, 8}, DType::f32, cpu);
  const DecodeStep s = make_step(c, DType::f32, cpu);
  const Tensor out = Tensor::empty(s.q.shape(), DType::f32, cpu);
  auto run = [&](const Tensor& slots, const Tensor& seq_ids) {
    return testing::error_message([&] {
      paged_decode_attention(s.q, s.k, s.v, qwen_rope(), k_pool, v_pool, slots, c.block_tables, seq_ids, c.positions, 0,
                             0, out);
    });
  };
  auto with = [&](const Tensor& t, int64_t i, int32_t value) {
    Tensor copy = t.clone();
    static_cast<int32_t*>(copy.data_ptr())[i] = value;
    return copy;
  };
  const std::string wrong_slot = run(with(s.slots, 2, c.pos[2] + 1000), c.seq_ids);
  EXPECT_NE(wrong_slot.find("[paged_decode_attention]"), std::string::npos) << wrong_slot;
  EXPECT_NE(wrong_slot.find("slots[2]"), std::string::npos) << wrong_slot;
  const std::string padding = run(with(s.slots, 1, 0), c.seq_ids);
  EXPECT_NE(padding.find("padding"), std::string::npos) << padding;
  const std::string twice = run(s.slots, with(c.seq_ids, 2, 0));
  EXPECT_NE(twice.find("appears twice"), std::string::npos) << twice;
  const std::string shape = testing::error_message([&] {
    paged_decode_attention(s.q, s.k.narrow(2, 0, 4), s.v, qwen_rope(), k_pool, v_pool, s.slots, c.block_tables,
                           c.seq_ids, c.positions, 0, 0, out);
  });
  EXPECT_NE(shape.find("k shape"), std::string::npos) << shape;
  EXPECT_EQ(run(s.slots, c.seq_ids), "no error");
}

// QK-norm in the decode step (Qwen3's and Gemma 3's heads): the step given the norm's weights equals, bit for bit,
// qk_rms_norm first and the step without them, for the attention alone and with the o projection, the pools too.
// CUDA folds the norm into its kernels' query and key loads (`bench --explain` says so), each fused path's.
void check_qk_norm_fold(const Cache& c, DType dtype, int64_t hidden, int64_t max_context, int64_t window, Device device,
                        const char* what) {
  SCOPED_TRACE(std::string(what) + " " + dtype_name(dtype));
  const Tensor k_pool = random_tensor({c.num_blocks, c.block_size, c.kv_heads, c.dim}, dtype, device);
  const Tensor v_pool = random_tensor({c.num_blocks, c.block_size, c.kv_heads, c.dim}, dtype, device);
  const DecodeStep s = make_step(c, dtype, device);
  const QkNormParams norm{random_tensor({c.dim}, dtype, device, 0.5, 1.5),
                          random_tensor({c.dim}, dtype, device, 0.5, 1.5), 1e-6};
  const auto [q_normed, k_normed] = qk_rms_norm(s.q, s.k, norm.q_weight, norm.k_weight, norm.eps);
  const Tensor o_weight = random_tensor({hidden, c.q_heads * c.dim}, dtype, device, -0.1, 0.1);
  const Tensor addend = random_tensor({rows(c), hidden}, dtype, device);
  for (const bool projected : {false, true}) {
    const Tensor k_want = k_pool.clone(), v_want = v_pool.clone(), k_got = k_pool.clone(), v_got = v_pool.clone();
    const Shape shape = projected ? Shape{rows(c), hidden} : s.q.shape();
    const Tensor want = Tensor::full(shape, NAN, dtype, device), got = Tensor::full(shape, NAN, dtype, device);
    auto step = [&](const Tensor& q, const Tensor& k, const Tensor& kp, const Tensor& vp, const Tensor& out,
                    const QkNormParams& qk_norm) {
      if (projected) {
        paged_decode_attention_projected(q, k, s.v, qwen_rope(), kp, vp, s.slots, c.block_tables, c.seq_ids,
                                         c.positions, 0, max_context, o_weight, addend, out, window, qk_norm);
      } else {
        paged_decode_attention(q, k, s.v, qwen_rope(), kp, vp, s.slots, c.block_tables, c.seq_ids, c.positions, 0,
                               max_context, out, window, qk_norm);
      }
    };
    step(q_normed, k_normed, k_want, v_want, want, {});
    step(s.q, s.k, k_got, v_got, got, norm);
    EXPECT_EQ(host_values(got), host_values(want)) << (projected ? "projected" : "attention");
    EXPECT_EQ(host_values(k_got), host_values(k_want));
    EXPECT_EQ(host_values(v_got), host_values(v_want));
  }
}

TEST_P(PagedAttentionTest, DecodeStepFoldsQkNormAsQkRmsNorm) {
  const Device d = device();
  set_recording_kernel_choices(true);
  clear_kernel_choices();
  for (DType dtype : kPoolTypes) {
    // Gemma 3 270M's heads (4 of D 256 over one kv head, hidden 640): a short context (one CTA a query head), a
    // long one (a token's cluster), its local layers' window, two tokens and a padding row.
    check_qk_norm_fold(make_cache({129}, 16, 1, 4, 256, 1, false, d, 3, 256), dtype, 640, 256, 0, d, "gemma b1");
    check_qk_norm_fold(make_cache({1500}, 16, 1, 4, 256, 1, false, d, 3, 2048), dtype, 640, 2048, 0, d, "gemma long");
    check_qk_norm_fold(make_cache({1500, 40}, 16, 1, 4, 256, 1, true, d, 3, 2048), dtype, 640, 2048, 512, d,
                       "gemma b2 + padding, window 512");
    // Qwen3-0.6B's heads (16 of D 128 over 8 kv heads, hidden 1024), a batch of 8.
    check_qk_norm_fold(make_cache({5, 300, 77, 1, 129, 40, 3, 250}, 16, 8, 16, 128, 1, false, d, 3, 512), dtype, 1024,
                       512, 0, d, "qwen3 b8");
  }
  set_recording_kernel_choices(false);
  if (d.is_cuda()) {  // 16-bit and f32 heads of D 256 are at most 512 bytes only in 16 bits
    int folded = 0, first = 0;
    for (const KernelChoice& k : kernel_choices()) {
      folded += k.choice.find("; QK-norm in its loads") != std::string::npos;
      first += k.choice.find("; qk_rms_norm first") != std::string::npos;
    }
    EXPECT_GT(folded, 0);
    EXPECT_GT(first, 0);  // f32 at D 256
  }
  clear_kernel_choices();
}

// `bench --explain`'s record: the decode step's plan, under the op that ran it, with the shapes it was chosen by.
TEST_P(PagedAttentionTest, ExplainRecordsThePlanThatRan) {
  const Device d = device();
  if (!d.is_cuda()) GTEST_SKIP() << "the CPU's fusions run their compositions: there is no kernel to choose";
  if (detail::path_disabled(detail::FastPath::attention_o)) GTEST_SKIP() << "MICROLLM_DISABLE=attention-o is set";
  set_recording_kernel_choices(true);
  clear_kernel_choices();
  check_projected_matches_reference(make_cache({129}, 16, 2, 14, 64, 1, false, d, 3, 256), DType::bf16, 896, true, 256,
                                    d, "qwen b1");
  set_recording_kernel_choices(false);
  const std::vector<KernelChoice> choices = kernel_choices();
  const auto it = std::find_if(choices.begin(), choices.end(),
                               [](const KernelChoice& c) { return c.op == "paged_decode_attention_projected"; });
  ASSERT_NE(it, choices.end());
  EXPECT_EQ(it->shapes, "tokens 1, heads 14/2 x 64, context 256, o 896x896");
  EXPECT_EQ(it->choice.rfind("projected: ", 0), 0u) << it->choice;
  clear_kernel_choices();
}

INSTANTIATE_TEST_SUITE_P(Devices, PagedAttentionTest, ::testing::ValuesIn(testing::test_devices()),
                         testing::device_test_name);

// ---- CUDA against the CPU reference on the same inputs, with no host <-> device transfer inside the ops ----

class PagedAttentionCudaTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { MICROLLM_SKIP_IF_UNAVAILABLE(Device::cuda(0)); }
  DType dtype() const { return GetParam(); }

  // Random pools (every slot holds keys), a cache of the given lengths; runs paged_attention on both devices.
  void parity(const std::vector<int64_t>& lengths, int64_t block_size, int64_t kv_heads, int64_t q_heads, int64_t dim,
              int64_t queries, bool padding, int64_t max_context, const char* what) {
    SCOPED_TRACE(std::string(what) + " " + dtype_name(dtype()));
    const Device cpu = Device::cpu(), gpu = Device::cuda(0);
    const Cache c = make_cache(lengths, block_size, kv_heads, q_heads, dim, queries, padding, cpu, 3, max_context);
    const Tensor k_pool = random_tensor({c.num_blocks, c.block_size, kv_heads, dim}, dtype(), cpu);
    const Tensor v_pool = random_tensor({c.num_blocks, c.block_size, kv_heads, dim}, dtype(), cpu);
    // q as the model produces it: a slice of a fused [N, (Hq + 2 Hkv) * D] QKV projection.
    const Tensor qkv = random_tensor({rows(c), (q_heads + 2 * kv_heads) * dim}, dtype(), cpu, -2, 2);
    const Tensor q = qkv.narrow(1, 0, q_heads * dim).view({rows(c), q_heads, dim});
    const int64_t context = max_context;  // 0: the table's capacity
    const Tensor want = paged_attention(q, k_pool, v_pool, c.block_tables, c.seq_ids, c.positions, 0, context);

    const Tensor kg = k_pool.to(gpu), vg = v_pool.to(gpu),
                 qg = qkv.to(gpu).narrow(1, 0, q_heads * dim).view({rows(c), q_heads, dim});
    const Tensor tables = c.block_tables.to(gpu), seq = c.seq_ids.to(gpu), pos = c.positions.to(gpu);
    const Tensor out = Tensor::full(q.shape(), NAN, dtype(), gpu);
    cuda::synchronize(0);
    cuda::reset_transfer_stats();
    paged_attention(qg, kg, vg, tables, seq, pos, 0, context, out);
    const Tensor got_new = paged_attention(qg, kg, vg, tables, seq, pos, 0, context);
    cuda::synchronize(0);
    const cuda::TransferStats moved = cuda::transfer_stats();
    EXPECT_EQ(moved.host_to_device, 0u) << "paged_attention copied host -> device";
    EXPECT_EQ(moved.device_to_host, 0u) << "paged_attention copied device -> host";
    const double tol = dtype() == DType::f32 ? 1e-5 : 1e-2;  // the Standards' bounds, as in cuda_parity_test
    EXPECT_LE(testing::relative_error(out.to(cpu), want), tol);
    EXPECT_LE(testing::relative_error(got_new.to(cpu), want), tol);
    for (double x : host_values(out)) ASSERT_TRUE(std::isfinite(x));
  }
};

TEST_P(PagedAttentionCudaTest, QwenAndR1DecodeShapes) {
  for (int64_t batch : {1, 3, 8, 32}) {
    std::vector<int64_t> lengths;
    for (int64_t b = 0; b < batch; ++b) lengths.push_back(1 + (b * 997 + 13) % 1500);
    parity(lengths, 16, 2, 14, 64, 1, false, 4096, "qwen decode, max_context 4096");
    parity(lengths, 16, 2, 12, 128, 1, false, 0, "r1 decode");
  }
}

TEST_P(PagedAttentionCudaTest, LongContextsBatch32) {
  std::vector<int64_t> lengths;
  for (int64_t b = 0; b < 32; ++b) lengths.push_back(3890 + (b * 37) % 200);  // up to 4089 < max_context
  parity(lengths, 16, 2, 14, 64, 1, false, 4096, "qwen batch 32 ~4000");
  parity(lengths, 32, 2, 12, 128, 1, true, 4200, "r1 batch 32 ~4000, padding");
}

TEST_P(PagedAttentionCudaTest, ChunksPaddingAndOtherHeadDims) {
  parity({37, 200, 5, 64, 1}, 16, 2, 14, 64, 5, true, 0, "qwen chunks + padding");
  parity({100, 513, 7}, 8, 2, 12, 128, 9, true, 700, "r1 chunks, block 8");
  parity({50, 3, 90}, 4, 3, 6, 40, 2, true, 0, "d40 (fallback kernel)");
  parity({20, 33}, 5, 1, 8, 64, 3, false, 0, "MQA group 8, odd block size");
  parity({64}, 16, 4, 4, 128, 1, false, 0, "MHA d128");
  parity({300, 17}, 16, 2, 32, 64, 2, true, 0, "group 16: two row blocks per kv head");
  parity({100, 250}, 16, 1, 12, 128, 1, false, 0, "group 12: a partial second row block");
}

// The fused decode step on CUDA against the CPU reference, at the models' shapes, without transfers.
TEST_P(PagedAttentionCudaTest, DecodeAttentionMatchesTheCpu) {
  const Device cpu = Device::cpu(), gpu = Device::cuda(0);
  for (int64_t batch : {1, 8, 32}) {
    std::vector<int64_t> lengths;
    for (int64_t b = 0; b < batch; ++b) lengths.push_back(1 + (b * 613 + 29) % 1200);
    for (const auto& [q_heads, dim, context] :
         {std::tuple<int64_t, int64_t, int64_t>{14, 64, 256}, {14, 64, 2048}, {12, 128, 0}}) {
      SCOPED_TRACE(str_cat("batch ", batch, " heads ", q_heads, " dim ", dim, " context ", context));
      std::vector<int64_t> fit = lengths;
      if (context > 0) {
        for (int64_t& len : fit) len = std::min(len, context);
      }
      const Cache c = make_cache(fit, 16, 2, q_heads, dim, 1, batch > 1, cpu, 3, context);
      const Tensor k_pool = random_tensor({c.num_blocks, 16, 2, dim}, dtype(), cpu);
      const Tensor v_pool = random_tensor({c.num_blocks, 16, 2, dim}, dtype(), cpu);
      const Tensor kg = k_pool.to(gpu), vg = v_pool.to(gpu);
      const DecodeStep s = make_step(c, dtype(), cpu);
      const Tensor want = Tensor::empty(s.q.shape(), dtype(), cpu);
      paged_decode_attention(s.q, s.k, s.v, qwen_rope(), k_pool, v_pool, s.slots, c.block_tables, c.seq_ids,
                             c.positions, 0, context, want);
      const DecodeStep g = step_of(c, s.qkv.to(gpu), s.slots.to(gpu));
      const Tensor tables = c.block_tables.to(gpu), seq = c.seq_ids.to(gpu), pos = c.positions.to(gpu);
      const Tensor out = Tensor::full(s.q.shape(), NAN, dtype(), gpu);
      cuda::synchronize(0);
      cuda::reset_transfer_stats();
      paged_decode_attention(g.q, g.k, g.v, qwen_rope(), kg, vg, g.slots, tables, seq, pos, 0, context, out);
      cuda::synchronize(0);
      EXPECT_EQ(cuda::transfer_stats().host_to_device, 0u);
      EXPECT_EQ(cuda::transfer_stats().device_to_host, 0u);
      const double tol = dtype() == DType::f32 ? 1e-5 : 1e-2;
      EXPECT_LE(testing::relative_error(out.to(cpu), want), tol);
      EXPECT_LE(testing::relative_error(kg.to(cpu), k_pool), tol);
      EXPECT_EQ(host_values(vg), host_values(v_pool));  // values are copied, never rounded
      for (double x : host_values(out)) ASSERT_TRUE(std::isfinite(x));
    }
  }
}

// paged_kv_write and paged_gather on CUDA give the CPU's pools and copies, without transfers.
TEST_P(PagedAttentionCudaTest, WriteAndGather) {
  const Device cpu = Device::cpu(), gpu = Device::cuda(0);
  const Cache c = make_cache({300, 45}, 16, 2, 2, 64, 1, false, cpu);
  const Tensor k_pool = random_tensor({c.num_blocks, c.block_size, 2, 64}, dtype(), cpu);
  const Tensor v_pool = random_tensor({c.num_blocks, c.block_size, 2, 64}, dtype(), cpu);
  const Tensor kg = k_pool.to(gpu), vg = v_pool.to(gpu);
  std::vector<int32_t> slots(c.slots.begin(), c.slots.end());
  for (size_t i = 0; i < slots.size(); i += 5) slots[i] = -1;
  const int64_t n = static_cast<int64_t>(slots.size());
  const Tensor kv = random_tensor({n, 2 * 2 * 64}, DType::f32, cpu);  // fused [N, 2 * Hkv * D], f32 source
  const Tensor slot_t = Tensor::from_vector(slots, {n});
  auto k_of = [](const Tensor& t) { return t.narrow(1, 0, 128).view({t.size(0), 2, 64}); };
  auto v_of = [](const Tensor& t) { return t.narrow(1, 128, 128).view({t.size(0), 2, 64}); };
  paged_kv_write(k_pool, v_pool, k_of(kv), v_of(kv), slot_t);
  const Tensor kv_g = kv.to(gpu), slot_g = slot_t.to(gpu), row_g = c.block_tables.select(0, 0).to(gpu);
  cuda::synchronize(0);
  cuda::reset_transfer_stats();
  paged_kv_write(kg, vg, k_of(kv_g), v_of(kv_g), slot_g);
  const Tensor gathered = paged_gather(vg, row_g, 300);
  cuda::synchronize(0);
  EXPECT_EQ(cuda::transfer_stats().host_to_device, 0u);
  EXPECT_EQ(cuda::transfer_stats().device_to_host, 0u);
  EXPECT_EQ(host_values(kg), host_values(k_pool));
  EXPECT_EQ(host_values(vg), host_values(v_pool));
  EXPECT_EQ(host_values(gathered), host_values(paged_gather(v_pool, c.block_tables.select(0, 0), 300)));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PagedAttentionCudaTest, ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         testing::cuda_dtype_test_name);

}  // namespace
}  // namespace microllm
