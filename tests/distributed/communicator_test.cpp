// Collectives on random data: every rank makes its input from a seed shared through rank 0, so each can
// compute the expected result of the whole job (sums in f64) and compare. Run alone (the local
// communicator, world 1) and under `mpirun -np 2` / `-np 4` (MPI): see tests/CMakeLists.txt.
#include "microllm/distributed/communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "distributed_test_util.h"
#include "test_support.h"

namespace microllm::distributed {
namespace {

using testing::job;
using testing::shared_seed;

// Rank r's input for a collective: uniform in [-1, 1), from (seed, r).
Tensor rank_input(int64_t n, DType dtype, uint64_t seed, int r) {
  Generator gen(seed + static_cast<uint64_t>(r) * 7919);
  return Tensor::uniform({n}, gen, -1, 1, DType::f32).to(dtype);
}

// sum over ranks of rank_input, in f64.
std::vector<double> expected_sum(int64_t n, DType dtype, uint64_t seed, int world) {
  std::vector<double> sum(static_cast<size_t>(n), 0.0);
  for (int r = 0; r < world; ++r) {
    const std::vector<double> v = rank_input(n, dtype, seed, r).to_vector<double>();
    for (size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
  }
  return sum;
}

// Sum over ranks of |rank_input|: the scale of a sum's rounding error (a sum that nearly cancels has a large
// error relative to itself, not relative to this).
std::vector<double> magnitude_sum(int64_t n, DType dtype, uint64_t seed, int world) {
  std::vector<double> sum(static_cast<size_t>(n), 0.0);
  for (int r = 0; r < world; ++r) {
    const std::vector<double> v = rank_input(n, dtype, seed, r).to_vector<double>();
    for (size_t i = 0; i < v.size(); ++i) sum[i] += std::abs(v[i]);
  }
  return sum;
}

// ||out - expected|| / ||scale||: each step of a bf16 sum rounds to 2^-9 of a partial sum at most.
double sum_error(const Tensor& out, const std::vector<double>& expected, const std::vector<double>& scale) {
  const std::vector<double> got = out.to_vector<double>();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (got[i] - expected[i]) * (got[i] - expected[i]);
    norm += scale[i] * scale[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

double tolerance_for(DType dtype) { return dtype == DType::bf16 ? 1e-2 : 1e-6; }

// Every rank holds the same bytes in `t`: rank 0's copy is broadcast and compared bit for bit.
void expect_same_on_every_rank(const Tensor& t, const std::string& what) {
  Tensor reference = t.clone();
  job().broadcast(reference, 0);
  EXPECT_EQ(std::memcmp(reference.data_ptr(), t.data_ptr(), t.nbytes()), 0)
      << what << " differs between rank 0 and rank " << job().rank();
}

class CollectiveTest : public ::testing::TestWithParam<DType> {};

TEST_P(CollectiveTest, AllReduceSumAndAverage) {
  const DType dtype = GetParam();
  const int world = job().world_size(), rank = job().rank();
  for (const int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
    const uint64_t seed = shared_seed();
    const std::vector<double> sum = expected_sum(n, dtype, seed, world);
    const std::vector<double> scale = magnitude_sum(n, dtype, seed, world);
    Tensor t = rank_input(n, dtype, seed, rank);
    job().all_reduce(t, ReduceOp::sum);
    EXPECT_LE(sum_error(t, sum, scale), tolerance_for(dtype)) << "sum of " << n << " elements";
    expect_same_on_every_rank(t, "the all-reduced sum");

    Tensor a = rank_input(n, dtype, seed, rank);
    job().all_reduce(a, ReduceOp::avg);
    std::vector<double> mean = sum, mean_scale = scale;
    for (double& v : mean) v /= world;
    for (double& v : mean_scale) v /= world;
    EXPECT_LE(sum_error(a, mean, mean_scale), tolerance_for(dtype)) << "mean of " << n << " elements";
  }
}

TEST_P(CollectiveTest, ReduceScatterGivesEachRankItsBlock) {
  const DType dtype = GetParam();
  const int world = job().world_size(), rank = job().rank();
  const int64_t block = 5003;
  const uint64_t seed = shared_seed();
  const std::vector<double> sum = expected_sum(block * world, dtype, seed, world);
  const std::vector<double> scale = magnitude_sum(block * world, dtype, seed, world);
  const Tensor input = rank_input(block * world, dtype, seed, rank);
  for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    Tensor output = Tensor::zeros({block}, dtype);
    job().reduce_scatter(input, output, op);
    std::vector<double> expected(sum.begin() + rank * block, sum.begin() + (rank + 1) * block);
    std::vector<double> bound(scale.begin() + rank * block, scale.begin() + (rank + 1) * block);
    if (op == ReduceOp::avg) {
      for (double& v : expected) v /= world;
      for (double& v : bound) v /= world;
    }
    EXPECT_LE(sum_error(output, expected, bound), tolerance_for(dtype)) << reduce_op_name(op);
  }
}

TEST_P(CollectiveTest, AllGatherConcatenatesInRankOrder) {
  const DType dtype = GetParam();
  const int world = job().world_size(), rank = job().rank();
  const int64_t block = 777;
  const uint64_t seed = shared_seed();
  Tensor output = Tensor::zeros({block * world}, dtype);
  job().all_gather(rank_input(block, dtype, seed, rank), output);
  for (int r = 0; r < world; ++r) {
    const Tensor expected = rank_input(block, dtype, seed, r);
    EXPECT_EQ(std::memcmp(output.narrow(0, r * block, block).data_ptr(), expected.data_ptr(), expected.nbytes()), 0)
        << "block " << r;
  }
  // In place: the input is this rank's block of the output.
  Tensor flat = Tensor::zeros({block * world}, dtype);
  Tensor mine = flat.narrow(0, rank * block, block);
  mine.copy_(rank_input(block, dtype, seed, rank));
  job().all_gather(mine, flat);
  EXPECT_EQ(std::memcmp(flat.data_ptr(), output.data_ptr(), output.nbytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CollectiveTest, ::testing::Values(DType::f32, DType::bf16),
                         [](const ::testing::TestParamInfo<DType>& p) { return std::string(dtype_name(p.param)); });

TEST(Communicator, AsyncCollectivesCompleteInAnyWaitOrder) {
  const int world = job().world_size(), rank = job().rank();
  const uint64_t seed = shared_seed();
  std::vector<Tensor> tensors;
  std::vector<std::unique_ptr<Work>> works;
  for (int i = 0; i < 4; ++i) {
    tensors.push_back(rank_input(4096 * (i + 1), DType::f32, seed + static_cast<uint64_t>(i), rank));
    works.push_back(job().all_reduce_async(tensors.back(), ReduceOp::sum));
  }
  for (int i = 3; i >= 0; --i) works[static_cast<size_t>(i)]->wait();
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(works[static_cast<size_t>(i)]->test());
    const uint64_t s = seed + static_cast<uint64_t>(i);
    EXPECT_LE(sum_error(tensors[static_cast<size_t>(i)], expected_sum(4096 * (i + 1), DType::f32, s, world),
                        magnitude_sum(4096 * (i + 1), DType::f32, s, world)),
              1e-6);
  }
}

TEST(Communicator, BroadcastAnyDtypeFromAnyRoot) {
  const int world = job().world_size(), rank = job().rank();
  for (int root = 0; root < world; ++root) {
    Tensor t = Tensor::from_vector(std::vector<int64_t>{rank * 10 + 1, rank * 10 + 2, -rank}, {3});
    job().broadcast(t, root);
    EXPECT_EQ(t.to_vector<int64_t>(), (std::vector<int64_t>{root * 10 + 1, root * 10 + 2, -root}));
  }
  job().barrier();
}

TEST(Communicator, ScalarsAndIdentity) {
  const int world = job().world_size(), rank = job().rank();
  EXPECT_EQ(job().all_reduce_scalar(rank + 1.0), world * (world + 1) / 2.0);
  EXPECT_EQ(job().all_reduce_scalar(rank == 0 ? 1.0 : 0.0), 1.0);
  EXPECT_GE(rank, 0);
  EXPECT_LT(rank, world);
  const LaunchInfo launch = detect_launch();
  EXPECT_EQ(launch.world_size, world);
  EXPECT_EQ(launch.rank, rank);
}

TEST(Communicator, BadArgumentsThrowBeforeAnyTraffic) {
  // Every rank throws the same way, so no rank is left waiting.
  EXPECT_THROW(job().all_reduce(Tensor::zeros({4}, DType::i32)), DTypeError);
  EXPECT_THROW(job().all_reduce(Tensor::zeros({4, 4}).t()), ValueError);
  Tensor out = Tensor::zeros({3});
  EXPECT_THROW(job().reduce_scatter(Tensor::zeros({3 * job().world_size() + 1}), out), ShapeError);
  EXPECT_THROW(job().broadcast(Tensor::zeros({2}), job().world_size()), ValueError);
}

TEST(Communicator, FactoryRefusesWhatThisBuildOrDeviceCannotDo) {
  if (!nccl_built()) {
    EXPECT_THROW(create_communicator({.backend = "nccl", .device = Device::cuda(0)}), NotSupportedError);
  }
  EXPECT_THROW(create_communicator({.backend = "mpi", .device = Device::cuda(0)}), DeviceError);
  EXPECT_THROW(create_communicator({.backend = "gloo"}), ValueError);
  EXPECT_EQ(make_local_communicator()->world_size(), 1);
}

}  // namespace
}  // namespace microllm::distributed
