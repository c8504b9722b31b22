// The CUDA runtime of core: the caching allocator, streams and events, host<->device copies through
// pinned staging, the strided copy/cast kernel, fills, transfer counters and device error reports.
// Every test here needs a GPU; without one they skip and say why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "microllm/core/cuda.h"
#include "microllm/core/tensor.h"
#include "microllm/ops/indexing.h"
#include "test_support.h"

namespace microllm {
namespace {

using testing::random_tensor;

class CudaRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override { MICROLLM_SKIP_IF_UNAVAILABLE(Device::cuda(0)); }
};

TEST_F(CudaRuntimeTest, DevicePropertiesDescribeTheGpu) {
  const cuda::DeviceProperties p = cuda::device_properties(0);
  EXPECT_FALSE(p.name.empty());
  EXPECT_GE(p.major, 7);
  EXPECT_GT(p.multiprocessors, 0);
  EXPECT_GT(p.total_memory, size_t{1} << 30);
  EXPECT_THROW(cuda::device_properties(cuda_device_count()), DeviceError);
}

TEST_F(CudaRuntimeTest, CachingAllocatorReusesFreedBlocksAndCounts) {
  cuda::empty_cache(0);
  const cuda::AllocatorStats before = cuda::allocator_stats(0);
  {
    Tensor a = Tensor::empty({1000, 1000}, DType::f32, Device::cuda(0));  // 4 MB: one new block
    const cuda::AllocatorStats mid = cuda::allocator_stats(0);
    EXPECT_EQ(mid.backend_allocs, before.backend_allocs + 1);
    EXPECT_GE(mid.allocated_bytes, before.allocated_bytes + 4000000);
    EXPECT_GE(mid.peak_allocated_bytes, mid.allocated_bytes);
  }
  const cuda::AllocatorStats freed = cuda::allocator_stats(0);
  EXPECT_EQ(freed.allocated_bytes, before.allocated_bytes);
  EXPECT_GT(freed.reserved_bytes, before.reserved_bytes);  // kept in the cache
  {
    Tensor b = Tensor::empty({999, 1001}, DType::f32, Device::cuda(0));  // same 2 MiB bucket: reused
    const cuda::AllocatorStats again = cuda::allocator_stats(0);
    EXPECT_EQ(again.backend_allocs, freed.backend_allocs);
    EXPECT_EQ(again.cache_hits, freed.cache_hits + 1);
  }
  cuda::empty_cache(0);
  EXPECT_EQ(cuda::allocator_stats(0).reserved_bytes, cuda::allocator_stats(0).allocated_bytes);
}

TEST_F(CudaRuntimeTest, OutOfMemoryIsAnErrorNotACrash) {
  const size_t too_much = cuda::device_properties(0).total_memory * 2;
  EXPECT_THROW(Tensor::empty({static_cast<int64_t>(too_much / 4)}, DType::f32, Device::cuda(0)), OutOfMemoryError);
  Tensor still_works = Tensor::ones({16}, DType::f32, Device::cuda(0));
  EXPECT_EQ(still_works.to_vector<float>()[15], 1.0f);
}

TEST_F(CudaRuntimeTest, CopiesRoundTripAtEverySizeAndCountTransfers) {
  // Below the direct-copy threshold, across several staging chunks, and an odd size.
  for (int64_t n : {int64_t{7}, int64_t{100000}, int64_t{9 << 20}, int64_t{(3 << 21) + 5}}) {
    const Tensor host = random_tensor({n}, DType::f32);
    cuda::reset_transfer_stats();
    const Tensor device = host.to(Device::cuda(0));
    const Tensor back = device.to(Device::cpu());
    const cuda::TransferStats stats = cuda::transfer_stats();
    EXPECT_EQ(stats.host_to_device, 1u);
    EXPECT_EQ(stats.device_to_host, 1u);
    EXPECT_EQ(stats.host_to_device_bytes, static_cast<uint64_t>(n) * 4);
    ASSERT_EQ(std::memcmp(host.data_ptr(), back.data_ptr(), host.nbytes()), 0) << "n = " << n;
  }
}

TEST_F(CudaRuntimeTest, AsyncCopiesThroughPinnedMemoryRoundTripInStreamOrderAndCount) {
  // Up, a kernel that reads it, and back, enqueued without the host waiting in between; the host reads the
  // pinned side once an event says the stream passed the copy.
  const int64_t n = 100003;
  const Tensor values = random_tensor({n}, DType::f32);
  cuda::PinnedBuffer up(static_cast<size_t>(n) * sizeof(float)), down(static_cast<size_t>(n) * sizeof(float));
  std::memcpy(up.data(), values.data_ptr(), up.bytes());
  std::fill_n(static_cast<float*>(down.data()), n, NAN);  // poison: an unwritten element shows
  const cuda::Stream stream = cuda::Stream::create(0);
  const Tensor device = Tensor::empty({n}, DType::f32, Device::cuda(0));
  cuda::reset_transfer_stats();
  cuda::Event done(0);
  {
    cuda::StreamGuard guard(stream);
    cuda::copy_async(device.data_ptr(), up.data(), up.bytes(), cuda::CopyDirection::host_to_device, stream);
    Tensor copied = Tensor::empty({n}, DType::f32, Device::cuda(0));
    copied.copy_(device);  // a device copy on the stream, after the upload
    cuda::copy_async(down.data(), copied.data_ptr(), down.bytes(), cuda::CopyDirection::device_to_host, stream);
    done.record(stream);
  }
  done.synchronize();
  const cuda::TransferStats stats = cuda::transfer_stats();
  EXPECT_EQ(stats.host_to_device, 1u);
  EXPECT_EQ(stats.device_to_host, 1u);
  EXPECT_EQ(stats.device_to_host_bytes, static_cast<uint64_t>(n) * 4);
  ASSERT_EQ(std::memcmp(down.data(), values.data_ptr(), down.bytes()), 0);
  cuda::PinnedBuffer moved = std::move(up);
  EXPECT_EQ(up.data(), nullptr);
  EXPECT_EQ(moved.bytes(), static_cast<size_t>(n) * sizeof(float));
}

TEST_F(CudaRuntimeTest, StagedUploadsLandInStreamOrderWhileTheSourceIsReusedAtOnce) {
  // The stream is kept busy with large device copies, so every upload is still queued when upload() returns;
  // the source is poisoned right after each call, and the 4 KiB arenas come round (and some uploads outgrow
  // them) many times while the earlier copies wait: a staged byte overwritten too early shows in the result.
  const cuda::Stream stream = cuda::Stream::create(0);
  const cuda::StreamGuard guard(stream);
  const int64_t big = int64_t{1} << 27;  // 512 MB of f32
  const Tensor from = Tensor::ones({big}, DType::f32, Device::cuda(0));
  Tensor to = Tensor::empty({big}, DType::f32, Device::cuda(0));
  const std::vector<float> pool = random_tensor({1 << 16}, DType::f32).to_vector<float>();
  std::mt19937 rng(::testing::UnitTest::GetInstance()->random_seed());
  std::uniform_int_distribution<int64_t> size(1, 3000), start(0, (1 << 16) - 3000);
  const int64_t uploads = 300;
  Tensor device = Tensor::full({uploads, 3000}, NAN, DType::f32, Device::cuda(0));
  std::vector<float> expected(static_cast<size_t>(uploads * 3000), NAN);
  cuda::UploadStaging staging(stream, 4096);
  std::vector<float> source;
  for (int64_t u = 0; u < uploads; ++u) {
    if (u % 50 == 0) to.copy_(from);  // ~0.3 ms of work ahead of the next uploads
    const int64_t n = size(rng), at = start(rng);
    source.assign(pool.begin() + at, pool.begin() + at + n);
    std::copy(source.begin(), source.end(), expected.begin() + u * 3000);
    staging.upload(device.select(0, u).data_ptr(), source.data(), static_cast<size_t>(n) * sizeof(float));
    std::fill(source.begin(), source.end(), -1.0f);  // the caller's source changes at once
  }
  const std::vector<float> got = device.to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i] == expected[i] || (std::isnan(got[i]) && std::isnan(expected[i])))
        << "upload " << i / 3000 << " element " << i % 3000 << ": " << got[i] << ", expected " << expected[i];
  }
  EXPECT_GT(staging.waits(), 0u);  // an arena came round while the stream had not passed its copies
  EXPECT_GT(staging.grows(), 0u);  // uploads of more than 4 KiB
}

TEST_F(CudaRuntimeTest, StridedCopyAndCastMatchTheCpuForEveryDtypePair) {
  const DType all[] = {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i8,
                       DType::u8,  DType::i32, DType::i64,  DType::f8_e4m3fn, DType::f8_e5m2};
  // Values that exercise rounding, saturation and NaN: a wide range plus specials.
  std::vector<float> values = random_tensor({6, 37}, DType::f32, Device::cpu(), -600, 600).to_vector<float>();
  values[0] = NAN;
  values[1] = INFINITY;
  values[2] = -INFINITY;
  values[3] = 464.0f;   // an e4m3fn tie
  values[4] = 1e-8f;    // an f16 subnormal range value
  const Tensor base = Tensor::from_vector(values, {6, 37});
  for (DType from : all) {
    const Tensor src_cpu = base.to(from).transpose(0, 1);  // strided source
    const Tensor src_gpu = base.to(from).to(Device::cuda(0)).transpose(0, 1);
    for (DType to : all) {
      const std::vector<double> expected = src_cpu.to(to).to_vector<double>();
      const std::vector<double> got = src_gpu.to(to).to_vector<double>();
      ASSERT_EQ(got.size(), expected.size());
      for (size_t i = 0; i < got.size(); ++i) {
        const bool both_nan = std::isnan(got[i]) && std::isnan(expected[i]);
        ASSERT_TRUE(both_nan || got[i] == expected[i])
            << from << " -> " << to << " at " << i << ": cuda " << got[i] << ", cpu " << expected[i];
      }
    }
  }
}

TEST_F(CudaRuntimeTest, FillsHappenOnTheDevice) {
  cuda::reset_transfer_stats();
  const Tensor z = Tensor::zeros({1000}, DType::bf16, Device::cuda(0));
  const Tensor f = Tensor::full({33, 3}, -2.5, DType::f32, Device::cuda(0));
  EXPECT_EQ(cuda::transfer_stats().host_to_device, 0u);
  for (float v : z.to_vector<float>()) ASSERT_EQ(v, 0.0f);
  for (float v : f.to_vector<float>()) ASSERT_EQ(v, -2.5f);
}

TEST_F(CudaRuntimeTest, StreamsEventsAndGuards) {
  const cuda::Stream stream = cuda::Stream::create(0);
  EXPECT_EQ(cuda::current_stream(0), cuda::Stream::default_stream(0));
  {
    cuda::StreamGuard guard(stream);
    EXPECT_EQ(cuda::current_stream(0), stream);
    cuda::Event start(0), end(0);
    start.record(stream);
    Tensor t = Tensor::full({1 << 20}, 3.0, DType::f32, Device::cuda(0));  // runs on `stream`
    end.record(stream);
    end.synchronize();
    EXPECT_GE(cuda::Event::elapsed_ms(start, end), 0.0f);
    EXPECT_EQ(t.to_vector<float>()[12345], 3.0f);
  }
  EXPECT_EQ(cuda::current_stream(0), cuda::Stream::default_stream(0));
}

TEST_F(CudaRuntimeTest, GraphsReplayTheirKernelsOnMemoryNoOtherWorkGets) {
  const Device gpu = Device::cuda(0);
  const cuda::Stream stream = cuda::Stream::create(0);
  const uint64_t pool = cuda::create_graph_pool();
  const Shape shape{4099};
  Tensor input, output;
  {
    cuda::StreamGuard on(stream);
    input = Tensor::full(shape, 1.0, DType::f32, gpu);
    output = Tensor::full(shape, -5.0, DType::f64, gpu);
  }
  stream.synchronize();
  cuda::Graph graph = cuda::Graph::capture(stream, pool, [&] {
    const Tensor rounded = input.to(DType::bf16);  // allocated and freed inside the capture
    output.copy_(rounded);
  });
  ASSERT_FALSE(graph.empty());
  EXPECT_EQ(output.to_vector<double>()[0], -5.0) << "capturing ran nothing";
  // Work on the same stream that frees and allocates blocks of the intermediate's size must not receive
  // the graph's block, or a replay would overwrite it.
  std::vector<Tensor> others;
  {
    cuda::StreamGuard on(stream);
    for (int i = 0; i < 4; ++i) others.push_back(Tensor::full(shape, 7.0, DType::bf16, gpu));
  }
  for (int round = 0; round < 3; ++round) {
    const Tensor fresh = random_tensor(shape);
    {
      cuda::StreamGuard on(stream);
      input.copy_(fresh);
    }
    graph.replay();
    stream.synchronize();
    const std::vector<double> want = fresh.to(DType::bf16).to_vector<double>();
    EXPECT_EQ(output.to_vector<double>(), want) << "replay " << round;
  }
  for (const Tensor& t : others) {
    const std::vector<float> values = t.to_vector<float>();
    EXPECT_TRUE(std::all_of(values.begin(), values.end(), [](float v) { return v == 7.0f; }));
  }
  EXPECT_THROW(cuda::Graph::capture(cuda::Stream::default_stream(0), pool, [] {}), ValueError);
  EXPECT_THROW(cuda::Graph().replay(), ValueError);
  EXPECT_THROW(cuda::Graph::capture(stream, pool, [] { throw ValueError("test", "thrown in capture"); }), ValueError);
  graph = cuda::Graph();
  cuda::release_graph_pool(0, pool);
  EXPECT_GT(cuda::memory_info(0).total, 0u);
}

TEST_F(CudaRuntimeTest, KernelsReportBadIdsAtTheNextSynchronization) {
  const Tensor weight = random_tensor({10, 4}, DType::f32, Device::cuda(0));
  const Tensor ids = Tensor::from_vector<int64_t>({1, 12, 3}, {3}).to(Device::cuda(0));
  Tensor out = embedding(weight, ids);  // the CPU-side check cannot see device ids: the kernel reports
  try {
    out.to(Device::cpu());
    FAIL() << "expected an IndexError for id 12";
  } catch (const IndexError& e) {
    EXPECT_NE(std::string(e.what()).find("12"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[embedding]"), std::string::npos) << e.what();
  }
  // The report is cleared: the next good op works.
  EXPECT_EQ(embedding(weight, Tensor::from_vector<int64_t>({2}, {1}).to(Device::cuda(0))).to(Device::cpu()).numel(), 4);
}

}  // namespace
}  // namespace microllm
