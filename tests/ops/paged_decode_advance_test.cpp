// paged_decode_advance (the end of a replayed decode step) against its rule written out here, on every device:
// fresh random positions in shuffled block tables, rows not fed (-1), rows crossing a block boundary and rows at
// the table's last slot (whose next slot is -1), an outbox filled with a marker so a row written twice, or one
// not written, shows; three calls, so the counter's rows alternate. On CUDA: the same inputs against the CPU,
// an outbox in mapped pinned memory written from a replayed CUDA graph, and contract errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "microllm/core/cuda.h"
#include "microllm/ops/paged_attention.h"
#include "test_support.h"

namespace microllm {
namespace {

constexpr int32_t kMarker = -7777;  // an outbox element nobody wrote

// A batch of `batch` decode rows over tables of `columns` shuffled blocks of `block_size`, positions random in
// the table's range, every third row not fed, row 1 at the last slot of its table, row 2 at the end of a block.
struct Batch {
  int64_t batch, columns, block_size;
  std::vector<int32_t> tables;  // [batch, columns]
  std::vector<int32_t> inputs;  // [3, batch]: rotary positions, attention positions, slots
};

Batch make_batch(int64_t batch, int64_t columns, int64_t block_size, std::mt19937& rng) {
  Batch b{batch, columns, block_size, {}, {}};
  std::vector<int32_t> blocks(static_cast<size_t>(batch * columns));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  b.tables = blocks;
  b.inputs.assign(static_cast<size_t>(3 * batch), -1);
  const int64_t capacity = columns * block_size;
  std::uniform_int_distribution<int64_t> position(0, capacity - 1);
  for (int64_t r = 0; r < batch; ++r) {
    const auto at = static_cast<size_t>(r);
    if (r % 3 == 0 && r > 0) {  // not fed: rotary 0, attention -1, slot -1 (what the engine writes)
      b.inputs[at] = 0;
      continue;
    }
    int64_t p = position(rng);
    if (r == 1) p = capacity - 1;
    if (r == 2) p = std::min<int64_t>(block_size - 1, capacity - 1);
    const int64_t block = b.tables[static_cast<size_t>(r * columns + p / block_size)];
    b.inputs[at] = static_cast<int32_t>(p + 5);  // rotary positions may differ from attention positions
    b.inputs[static_cast<size_t>(batch) + at] = static_cast<int32_t>(p);
    b.inputs[static_cast<size_t>(2 * batch) + at] = static_cast<int32_t>(block * block_size + p % block_size);
  }
  return b;
}

// The op's rule, written out.
std::vector<int32_t> advanced(const Batch& b, std::vector<int32_t> inputs) {
  const auto n = static_cast<size_t>(b.batch);
  for (size_t r = 0; r < n; ++r) {
    if (inputs[n + r] < 0) continue;
    const int64_t next = inputs[n + r] + 1, column = next / b.block_size;
    inputs[r] += 1;
    inputs[n + r] = static_cast<int32_t>(next);
    inputs[2 * n + r] =
        column < b.columns
            ? static_cast<int32_t>(b.tables[r * static_cast<size_t>(b.columns) + static_cast<size_t>(column)] *
                                       b.block_size +
                                   next % b.block_size)
            : -1;
  }
  return inputs;
}

std::vector<int32_t> random_ids(int64_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> id(0, 151935);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& x : ids) x = id(rng);
  return ids;
}

class PagedDecodeAdvanceTest : public testing::DeviceTest {};

TEST_P(PagedDecodeAdvanceTest, MovesFedRowsOnAndHandsTheIdsToAlternatingOutboxRows) {
  std::mt19937 rng(static_cast<uint32_t>(testing::fresh_seed()));
  for (const auto& [batch, columns, block_size] :
       std::vector<std::array<int64_t, 3>>{{1, 4, 16}, {9, 5, 16}, {300, 3, 7}}) {
    SCOPED_TRACE("batch " + std::to_string(batch) + " columns " + std::to_string(columns));
    const Batch b = make_batch(batch, columns, block_size, rng);
    const Tensor tables = Tensor::from_vector(b.tables, {batch, columns}).to(device());
    const Tensor inputs = Tensor::from_vector(b.inputs, {3, batch}).to(device());
    const int64_t width = batch + 3;  // wider than the ids: the rest of a row stays untouched
    const Tensor outbox = Tensor::full({2, width}, kMarker, DType::i32, device());
    const Tensor counter = Tensor::zeros({1}, DType::i32, device());
    std::vector<int32_t> want_inputs = b.inputs;
    std::vector<std::vector<int32_t>> want_rows(2, std::vector<int32_t>(static_cast<size_t>(width), kMarker));
    for (int call = 0; call < 3; ++call) {
      const int64_t n = call == 2 ? batch / 2 + 1 : batch;  // a graph of fewer rows than the inputs
      const std::vector<int32_t> ids = random_ids(n, rng);
      paged_decode_advance(inputs, tables, block_size, Tensor::from_vector(ids, {n}).to(device()), outbox, counter);
      want_inputs = advanced(b, want_inputs);
      std::copy(ids.begin(), ids.end(), want_rows[static_cast<size_t>(call % 2)].begin());
      ASSERT_EQ(inputs.to(Device::cpu()).to_vector<int32_t>(), want_inputs) << "call " << call;
      const std::vector<int32_t> got = outbox.to(Device::cpu()).to_vector<int32_t>();
      for (size_t row = 0; row < 2; ++row) {
        ASSERT_EQ(std::vector<int32_t>(got.begin() + static_cast<int64_t>(row) * width,
                                       got.begin() + static_cast<int64_t>(row + 1) * width),
                  want_rows[row])
            << "outbox row " << row << " after call " << call;
      }
      ASSERT_EQ(counter.to(Device::cpu()).to_vector<int32_t>(), std::vector<int32_t>{call + 1});
    }
    // Without a hand-over: the inputs move on, nothing else is touched.
    paged_decode_advance(inputs, tables, block_size);
    ASSERT_EQ(inputs.to(Device::cpu()).to_vector<int32_t>(), advanced(b, want_inputs));
    ASSERT_EQ(counter.to(Device::cpu()).to_vector<int32_t>(), std::vector<int32_t>{3});
  }
}

// The counter counts modulo 2^32: past 2^31 steps (weeks of serving) it goes on, never negative, and with two rows
// they keep alternating across the wrap.
TEST_P(PagedDecodeAdvanceTest, TheCounterWrapsWithoutGoingNegative) {
  std::mt19937 rng(static_cast<uint32_t>(testing::fresh_seed()));
  const Batch b = make_batch(5, 3, 16, rng);
  const Tensor tables = Tensor::from_vector(b.tables, {b.batch, b.columns}).to(device());
  const Tensor inputs = Tensor::from_vector(b.inputs, {3, b.batch}).to(device());
  const Tensor outbox = Tensor::full({2, b.batch}, kMarker, DType::i32, device());
  for (const auto& [start, rows] : std::vector<std::pair<int32_t, std::vector<int>>>{
           {std::numeric_limits<int32_t>::max(), {1, 0, 1}}, {-1, {1, 0, 1}}}) {
    const Tensor counter = Tensor::from_vector(std::vector<int32_t>{start}, {1}).to(device());
    uint32_t expected = static_cast<uint32_t>(start);
    for (int row : rows) {
      const std::vector<int32_t> ids = random_ids(b.batch, rng);
      paged_decode_advance(inputs, tables, b.block_size, Tensor::from_vector(ids, {b.batch}).to(device()), outbox,
                           counter);
      const std::vector<int32_t> got = outbox.select(0, row).to(Device::cpu()).to_vector<int32_t>();
      ASSERT_EQ(got, ids) << "counter " << expected << " writes row " << row;
      expected += 1u;
      ASSERT_EQ(static_cast<uint32_t>(counter.to(Device::cpu()).to_vector<int32_t>()[0]), expected);
    }
  }
}

TEST_P(PagedDecodeAdvanceTest, ContractErrorsNameTheArgument) {
  const Tensor inputs = Tensor::zeros({3, 4}, DType::i32, device());
  const Tensor tables = Tensor::zeros({4, 2}, DType::i32, device());
  const Tensor ids = Tensor::zeros({4}, DType::i32, device()), counter = Tensor::zeros({1}, DType::i32, device());
  const Tensor outbox = Tensor::zeros({2, 4}, DType::i32, device());
  auto run = [&](const Tensor& in, const Tensor& t, int64_t block_size, const Tensor& i, const Tensor& o,
                 const Tensor& c) {
    return testing::error_message([&] { paged_decode_advance(in, t, block_size, i, o, c); });
  };
  EXPECT_NE(run(Tensor::zeros({2, 4}, DType::i32, device()), tables, 16, ids, outbox, counter).find("inputs shape"),
            std::string::npos);
  EXPECT_NE(
      run(Tensor::zeros({3, 4}, DType::i64, device()), tables, 16, ids, outbox, counter).find("inputs must be i32"),
      std::string::npos);
  EXPECT_NE(
      run(inputs, Tensor::zeros({3, 2}, DType::i32, device()), 16, ids, outbox, counter).find("block_tables shape"),
      std::string::npos);
  EXPECT_NE(run(inputs, tables, 0, ids, outbox, counter).find("block_size must be >= 1"), std::string::npos);
  EXPECT_NE(run(inputs, tables, 16, ids, Tensor(), counter).find("outbox is an undefined tensor"), std::string::npos);
  EXPECT_NE(run(inputs, tables, 16, ids, Tensor::zeros({2, 3}, DType::i32, device()), counter).find("outbox shape"),
            std::string::npos);
  EXPECT_NE(run(inputs, tables, 16, ids, outbox, Tensor::zeros({2}, DType::i32, device())).find("counter shape"),
            std::string::npos);
  const std::string message = run(inputs, tables, 16, ids.to(DType::i64), outbox, counter);
  EXPECT_NE(message.find("[paged_decode_advance] ids must be i32"), std::string::npos) << message;
  EXPECT_EQ(run(inputs, tables, 16, ids, outbox, counter), "no error");
}

INSTANTIATE_TEST_SUITE_P(Devices, PagedDecodeAdvanceTest, ::testing::ValuesIn(testing::test_devices()),
                         testing::device_test_name);

// CUDA: the kernel against the CPU reference on the same inputs, then the engine's use: a graph replayed twice
// that writes the ids into mapped pinned memory, read by the host after an event, alternating rows.
TEST(PagedDecodeAdvanceCudaTest, MatchesTheCpuAndWritesPinnedMemoryFromAGraph) {
  MICROLLM_SKIP_IF_UNAVAILABLE(Device::cuda(0));
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  std::mt19937 rng(static_cast<uint32_t>(testing::fresh_seed()));
  const Batch b = make_batch(64, 6, 16, rng);
  const Tensor tables = Tensor::from_vector(b.tables, {b.batch, b.columns});
  const Tensor on_cpu = Tensor::from_vector(b.inputs, {3, b.batch});
  const Tensor on_gpu = on_cpu.to(gpu);
  paged_decode_advance(on_cpu, tables, b.block_size);
  paged_decode_advance(on_gpu, tables.to(gpu), b.block_size);
  ASSERT_EQ(on_gpu.to(cpu).to_vector<int32_t>(), on_cpu.to_vector<int32_t>());

  const cuda::Stream stream = cuda::Stream::create(0);
  cuda::PinnedBuffer pinned(2 * static_cast<size_t>(b.batch) * sizeof(int32_t));
  auto* host = static_cast<int32_t*>(pinned.data());
  std::fill_n(host, 2 * b.batch, kMarker);
  const Tensor outbox = Tensor::from_blob(pinned.device_data(), {2, b.batch}, DType::i32, gpu);
  const Tensor counter = Tensor::zeros({1}, DType::i32, gpu);
  Tensor ids = Tensor::zeros({b.batch}, DType::i32, gpu);
  const Tensor inputs = on_gpu, gpu_tables = tables.to(gpu);
  cuda::synchronize(0);
  const uint64_t pool = cuda::create_graph_pool();
  {
    const cuda::Graph graph = cuda::Graph::capture(
        stream, pool, [&] { paged_decode_advance(inputs, gpu_tables, b.block_size, ids, outbox, counter); });
    cuda::Event done(0);
    for (int replay = 0; replay < 2; ++replay) {
      const std::vector<int32_t> want = random_ids(b.batch, rng);
      {
        const cuda::StreamGuard on(stream);
        ids.copy_(Tensor::from_vector(want, {b.batch}).to(gpu));
      }
      cuda::synchronize(0);
      graph.replay();
      done.record(stream);
      done.synchronize();
      ASSERT_EQ(std::vector<int32_t>(host + replay * b.batch, host + (replay + 1) * b.batch), want)
          << "replay " << replay;
      paged_decode_advance(on_cpu, tables, b.block_size);
      ASSERT_EQ(inputs.to(cpu).to_vector<int32_t>(), on_cpu.to_vector<int32_t>()) << "replay " << replay;
    }
  }
  cuda::release_graph_pool(0, pool);
}

}  // namespace
}  // namespace microllm
