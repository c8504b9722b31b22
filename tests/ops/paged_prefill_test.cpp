// paged_rope_kv_write (a prefill chunk's rotary embedding and cache write in one op) against the ops it stands
// for, rope(q), rope(k) and paged_kv_write, on every device: fresh random projections as views of one fused QKV
// output, NaN-filled pools (so a write to a wrong slot shows, and rows left alone stay NaN), slots in shuffled
// blocks with skipped (-1) rows, positions [B, T] (i32) and [T] (i64), the heads of Qwen2.5-0.5B (D 64) and
// R1-Distill-1.5B (D 128), every pool dtype, and the cases CUDA's kernel leaves to the composition (interleaved
// pairs, a head dim of 40). Same device, same arithmetic: outputs and pools equal bit for bit. Then CUDA against
// the CPU, a slot past the pool, and contract errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "microllm/core/cuda.h"
#include "microllm/ops/paged_attention.h"
#include "microllm/ops/rope.h"
#include "test_support.h"

namespace microllm {
namespace {

using testing::host_values;
using testing::llama3_interleaved_rope;
using testing::qwen_rope;
using testing::random_tensor;

// Equal values, NaN in the same places (the pools' rows that nobody writes): relative_error skips those and is
// NaN where one side has a NaN the other has not.
#define EXPECT_SAME_VALUES(out, ref) MICROLLM_EXPECT_CLOSE(out, ref, 0.0)

struct Shape4 {
  int64_t batch, tokens, q_heads, kv_heads, dim;
};

// A prefill chunk: q, k, v as views of one fused projection [B, T, (Hq + 2 Hkv) D], positions starting at `start`
// per sequence, and slots at distinct shuffled places of a pool of `slots_in_pool` slots, every fifth one -1.
struct Chunk {
  Tensor qkv, q, k, v, positions, slots;
};
Chunk make_chunk(const Shape4& s, DType dtype, Device device, int64_t start, bool shared_positions,
                 int64_t slots_in_pool) {
  Chunk c;
  const int64_t d = s.dim, n = s.batch * s.tokens;
  c.qkv = random_tensor({s.batch, s.tokens, (s.q_heads + 2 * s.kv_heads) * d}, dtype, device, -2, 2);
  c.q = c.qkv.narrow(2, 0, s.q_heads * d).view({s.batch, s.tokens, s.q_heads, d});
  c.k = c.qkv.narrow(2, s.q_heads * d, s.kv_heads * d).view({s.batch, s.tokens, s.kv_heads, d});
  c.v = c.qkv.narrow(2, (s.q_heads + s.kv_heads) * d, s.kv_heads * d).view({s.batch, s.tokens, s.kv_heads, d});
  if (shared_positions) {
    c.positions = Tensor::arange(static_cast<double>(start), static_cast<double>(start + s.tokens), 1, DType::i64,
                                 device);
  } else {
    std::vector<int32_t> pos;
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t t = 0; t < s.tokens; ++t) pos.push_back(static_cast<int32_t>(start + 97 * b + t));
    }
    c.positions = Tensor::from_vector(pos, {s.batch, s.tokens}).to(device);
  }
  std::vector<int32_t> order(static_cast<size_t>(slots_in_pool));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(testing::fresh_seed());
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> slots(order.begin(), order.begin() + n);
  for (size_t i = 3; i < slots.size(); i += 5) slots[i] = -1;
  c.slots = Tensor::from_vector(slots, {n}).to(device);
  return c;
}

class PagedRopeKvWriteTest : public testing::DeviceTest {};

TEST_P(PagedRopeKvWriteTest, EqualsRopeThenPagedKvWrite) {
  struct Case {
    const char* name;
    Shape4 shape;
    RopeParams rope;
    bool shared_positions;
  };
  const std::vector<Case> cases = {
      {"qwen2.5-0.5b heads, one sequence", {1, 77, 14, 2, 64}, qwen_rope(), true},
      {"r1-1.5b heads, two sequences", {2, 45, 12, 2, 128}, qwen_rope(), false},
      {"llama3 interleaved (the composition on CUDA)", {1, 20, 8, 2, 64}, llama3_interleaved_rope(), false},
      {"head dim 40 (the composition on CUDA)", {1, 19, 6, 3, 40}, qwen_rope(), true},
  };
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dtype));
      const Shape4& s = c.shape;
      const int64_t block_size = 16, blocks = (2 * s.batch * s.tokens + block_size - 1) / block_size;
      const Chunk chunk = make_chunk(s, dtype, device(), 300, c.shared_positions, blocks * block_size);
      const Tensor k_pool = Tensor::full({blocks, block_size, s.kv_heads, s.dim}, NAN, dtype, device());
      const Tensor v_pool = Tensor::full({blocks, block_size, s.kv_heads, s.dim}, NAN, dtype, device());
      const Tensor k_want = k_pool.clone(), v_want = v_pool.clone();
      const Tensor q_want = microllm::rope(chunk.q, chunk.positions, c.rope);
      const Tensor k_rot = microllm::rope(chunk.k, chunk.positions, c.rope);
      const int64_t n = s.batch * s.tokens;
      paged_kv_write(k_want, v_want, k_rot.reshape({n, s.kv_heads, s.dim}), chunk.v.reshape({n, s.kv_heads, s.dim}),
                     chunk.slots);

      const auto [q_out, k_out] =
          paged_rope_kv_write(chunk.q, chunk.k, chunk.v, chunk.positions, c.rope, k_pool, v_pool, chunk.slots);
      EXPECT_TRUE(q_out.is_contiguous());
      EXPECT_TRUE(k_out.is_contiguous());
      EXPECT_SAME_VALUES(q_out, q_want) << "q";
      EXPECT_SAME_VALUES(k_out, k_rot) << "k";
      EXPECT_SAME_VALUES(k_pool, k_want) << "k_pool";
      EXPECT_SAME_VALUES(v_pool, v_want) << "v_pool";
      // Every written slot now holds numbers; the skipped rows' slots and the spare ones are still NaN.
      int64_t finite = 0;
      for (double x : host_values(v_pool)) finite += std::isfinite(x) ? 1 : 0;
      int64_t written = 0;
      for (double slot : host_values(chunk.slots)) written += slot >= 0 ? 1 : 0;
      EXPECT_EQ(finite, written * s.kv_heads * s.dim);
    }
  }
}

TEST_P(PagedRopeKvWriteTest, ASlotPastThePoolIsAnIndexError) {
  const Shape4 s{1, 5, 4, 2, 64};
  const Chunk chunk = make_chunk(s, DType::bf16, device(), 0, true, 32);
  const Tensor k_pool = Tensor::zeros({2, 16, 2, 64}, DType::bf16, device()), v_pool = k_pool.clone();
  const Tensor slots = Tensor::from_vector(std::vector<int32_t>{0, 1, 32, 3, 4}, {5}).to(device());
  const std::string message = testing::index_error_message(device(), [&] {
    paged_rope_kv_write(chunk.q, chunk.k, chunk.v, chunk.positions, qwen_rope(), k_pool, v_pool, slots);
  });
  EXPECT_NE(message.find("slot"), std::string::npos) << message;
}

TEST_P(PagedRopeKvWriteTest, ContractErrorsNameTheOpAndTheArgument) {
  const Shape4 s{1, 6, 4, 2, 64};
  const Chunk c = make_chunk(s, DType::f32, device(), 0, true, 32);
  const Tensor kp = Tensor::zeros({2, 16, 2, 64}, DType::f32, device()), vp = kp.clone();
  auto expect = [](const std::string& message, const char* argument) {
    EXPECT_NE(message.find("[paged_rope_kv_write]"), std::string::npos) << message;
    EXPECT_NE(message.find(argument), std::string::npos) << message;
  };
  auto message = [](auto call) { return testing::error_message(call); };
  const RopeParams rope = qwen_rope();
  expect(message([&] { paged_rope_kv_write(c.q, c.k, c.v, c.positions, rope, kp, vp, c.slots.narrow(0, 0, 5)); }),
         "slots");
  expect(message([&] { paged_rope_kv_write(c.q, c.k.narrow(2, 0, 1), c.v, c.positions, rope, kp, vp, c.slots); }),
         "k shape");
  expect(message([&] { paged_rope_kv_write(c.q.narrow(2, 0, 3), c.k, c.v, c.positions, rope, kp, vp, c.slots); }),
         "q shape");
  expect(message([&] {
           paged_rope_kv_write(c.q, c.k, c.v.to(DType::bf16), c.positions, rope, kp, vp, c.slots);
         }),
         "v");
  expect(message([&] { paged_rope_kv_write(c.q, c.k, c.v, c.positions.narrow(0, 0, 5), rope, kp, vp, c.slots); }),
         "positions");
  RopeParams bad = rope;
  bad.theta = -1;
  expect(message([&] { paged_rope_kv_write(c.q, c.k, c.v, c.positions, bad, kp, vp, c.slots); }), "theta");
  EXPECT_EQ(message([&] { paged_rope_kv_write(c.q, c.k, c.v, c.positions, rope, kp, vp, c.slots); }), "no error");
}

INSTANTIATE_TEST_SUITE_P(Devices, PagedRopeKvWriteTest, ::testing::ValuesIn(testing::test_devices()),
                         testing::device_test_name);

// CUDA against the CPU at both models' prefill shapes: the sines and cosines of the two devices' math libraries
// differ in the last bit now and then, so the turned values agree to the dtype's tolerance; v is copied exactly.
class PagedRopeKvWriteCudaTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { MICROLLM_SKIP_IF_UNAVAILABLE(Device::cuda(0)); }
};

TEST_P(PagedRopeKvWriteCudaTest, MatchesTheCpu) {
  const DType dtype = GetParam();
  const Device cpu = Device::cpu(), gpu = Device::cuda(0);
  for (const Shape4& s : {Shape4{1, 2048, 14, 2, 64}, Shape4{1, 2048, 12, 2, 128}}) {
    SCOPED_TRACE(str_cat("heads ", s.q_heads, " dim ", s.dim, " ", dtype_name(dtype)));
    const int64_t blocks = 2 * s.tokens / 16;
    const Chunk c = make_chunk(s, dtype, cpu, 1000, true, blocks * 16);
    const Tensor k_pool = Tensor::full({blocks, 16, s.kv_heads, s.dim}, NAN, dtype, cpu), v_pool = k_pool.clone();
    const Tensor kg = k_pool.to(gpu), vg = v_pool.to(gpu);
    const auto [q_cpu, k_cpu] = paged_rope_kv_write(c.q, c.k, c.v, c.positions, qwen_rope(), k_pool, v_pool, c.slots);
    const Tensor qkv = c.qkv.to(gpu);
    const int64_t d = s.dim;
    const Tensor q = qkv.narrow(2, 0, s.q_heads * d).view({1, s.tokens, s.q_heads, d});
    const Tensor k = qkv.narrow(2, s.q_heads * d, s.kv_heads * d).view({1, s.tokens, s.kv_heads, d});
    const Tensor v = qkv.narrow(2, (s.q_heads + s.kv_heads) * d, s.kv_heads * d).view({1, s.tokens, s.kv_heads, d});
    const auto [q_gpu, k_gpu] = paged_rope_kv_write(q, k, v, c.positions.to(gpu), qwen_rope(), kg, vg, c.slots.to(gpu));
    const double tol = testing::tolerance(dtype);
    MICROLLM_EXPECT_CLOSE(q_gpu.to(cpu), q_cpu, tol);
    MICROLLM_EXPECT_CLOSE(k_gpu.to(cpu), k_cpu, tol);
    EXPECT_SAME_VALUES(vg.to(cpu), v_pool) << "v_pool";
    MICROLLM_EXPECT_CLOSE(kg.to(cpu), k_pool, tol) << "k_pool: NaN in the same places, close elsewhere";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PagedRopeKvWriteCudaTest, ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         testing::cuda_dtype_test_name);

}  // namespace
}  // namespace microllm
