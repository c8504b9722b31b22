// Indexing: embedding (i32/i64 ids) and its backward with repeated ids, concat/split and their
// backwards, topk (ties, k = 0, k = n, NaN) and its backward, scatter_add. Values against direct loops,
// non-contiguous inputs, contract errors, f64 finite-difference gradients.
#include "microllm/ops/indexing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "microllm/core/threads.h"
#include "test_support.h"

namespace microllm {
namespace {

using testing::expect_op_error;
using testing::host_values;
using testing::random_tensor;
using testing::tolerance;

class IndexingTest : public testing::DeviceTest {};

const DType kFloatTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

// Bad indices: the CPU names the op, the position and the range at once; CUDA kernels report the op
// and the bad value at the next synchronization.
void expect_index_error(Device device, const std::function<void()>& call, const std::string& op,
                        const std::vector<std::string>& cpu_parts, const std::string& bad_value) {
  const std::string message = testing::index_error_message(device, call);
  ASSERT_FALSE(message.empty()) << op << " did not report the bad index " << bad_value;
  EXPECT_NE(message.find(device.is_cpu() ? "[" + op + "]" : op), std::string::npos) << message;
  EXPECT_NE(message.find(bad_value), std::string::npos) << message;
  if (device.is_cpu()) {
    for (const std::string& part : cpu_parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

Tensor ids_tensor(const std::vector<int64_t>& ids, const Shape& shape, DType dtype, Device device) {
  return Tensor::from_vector(ids, shape).to(device, dtype);
}

// ---- embedding ----

TEST_P(IndexingTest, EmbeddingGathersRows) {
  const int64_t vocab = 11, dim = 5;
  for (DType dtype : kFloatTypes) {
    const Tensor weight = random_tensor({vocab, dim}, dtype, device());
    const Tensor ids_values = random_tensor({3, 4}, DType::i64, device(), 0, static_cast<double>(vocab));
    for (DType id_dtype : {DType::i32, DType::i64}) {
      const Tensor ids = ids_values.to(id_dtype);
      // Weights: contiguous, strided rows and columns, a transposed view; ids: contiguous and transposed.
      const Tensor wide = testing::non_contiguous(weight);
      const Tensor transposed = weight.t().contiguous().t();
      for (const Tensor& w : {weight, wide, transposed}) {
        for (const Tensor& index : {ids, ids.t()}) {
          const Tensor out = embedding(w, index);
          ASSERT_EQ(out.shape(), (Shape{index.size(0), index.size(1), dim}));
          ASSERT_EQ(out.dtype(), dtype);
          const std::vector<double> wv = host_values(w), iv = host_values(index);
          std::vector<double> ref;
          for (double id : iv)
            for (int64_t d = 0; d < dim; ++d)
              ref.push_back(wv[static_cast<size_t>(static_cast<int64_t>(id) * dim + d)]);
          MICROLLM_EXPECT_CLOSE(out, ref, 0.0) << dtype << " ids " << id_dtype << " weight strides " << w.strides();
        }
      }
    }
  }
  // Rank-0 ids give one row.
  const Tensor weight = random_tensor({4, 3}, DType::f32, device());
  const Tensor row = embedding(weight, Tensor::scalar(2, DType::i64, device()));
  EXPECT_EQ(row.shape(), (Shape{3}));
  EXPECT_EQ(row.to_vector<float>(), weight.select(0, 2).to_vector<float>());
}

TEST_P(IndexingTest, EmbeddingRejectsBadIdsNamingThePosition) {
  const Tensor weight = random_tensor({11, 5}, DType::f32, device());
  for (DType id_dtype : {DType::i32, DType::i64}) {
    expect_index_error(
        device(), [&] { embedding(weight, ids_tensor({0, 3, 11, 2}, {2, 2}, id_dtype, device())); }, "embedding",
        {"position 2", "[0, 11)"}, "11");
    expect_index_error(
        device(), [&] { embedding(weight, ids_tensor({-1}, {1}, id_dtype, device())); }, "embedding",
        {"position 0"}, "-1");
  }
  expect_op_error<DTypeError>([&] { embedding(weight, Tensor::zeros({2}, DType::f32, device())); }, "embedding");
  expect_op_error<DTypeError>([&] { embedding(weight, Tensor::zeros({2}, DType::u8, device())); }, "embedding");
  expect_op_error<ShapeError>([&] { embedding(weight.select(0, 0), ids_tensor({0}, {1}, DType::i64, device())); },
                              "embedding");
  expect_op_error<ValueError>([&] { embedding(Tensor(), ids_tensor({0}, {1}, DType::i64, device())); }, "embedding");
}

TEST_P(IndexingTest, EmbeddingBackwardSumsRepeatedIds) {
  const int64_t vocab = 7, dim = 5;
  const std::vector<int64_t> id_list = {3, 1, 3, 6, 3, 0, 1, 3};  // 3 four times, 1 twice, others never
  for (DType dtype : kFloatTypes) {
    for (DType id_dtype : {DType::i32, DType::i64}) {
      const Tensor ids = ids_tensor(id_list, {2, 4}, id_dtype, device());
      const Tensor grad = random_tensor({2, 4, dim}, dtype, device());
      for (const Tensor& g : {grad, testing::non_contiguous(grad)}) {
        const Tensor gw = embedding_backward(g, ids, vocab);
        ASSERT_EQ(gw.shape(), (Shape{vocab, dim}));
        ASSERT_EQ(gw.dtype(), dtype);
        const std::vector<double> gv = host_values(g);
        std::vector<double> ref(static_cast<size_t>(vocab * dim), 0.0);
        for (size_t n = 0; n < id_list.size(); ++n)
          for (int64_t d = 0; d < dim; ++d)
            ref[static_cast<size_t>(id_list[n] * dim + d)] += gv[n * static_cast<size_t>(dim) + static_cast<size_t>(d)];
        MICROLLM_EXPECT_CLOSE(gw, ref, tolerance(dtype)) << dtype << " " << id_dtype;
      }
    }
  }
  // Wide rows take the threaded path (columns split across threads).
  const Tensor ids = ids_tensor({2, 2, 0, 2}, {4}, DType::i64, device());
  const Tensor g = random_tensor({4, 300}, DType::f32, device());
  const std::vector<double> gv = host_values(g);
  std::vector<double> ref(3 * 300, 0.0);
  const int64_t rows[] = {2, 2, 0, 2};
  for (int64_t n = 0; n < 4; ++n)
    for (int64_t d = 0; d < 300; ++d)
      ref[static_cast<size_t>(rows[n] * 300 + d)] += gv[static_cast<size_t>(n * 300 + d)];
  MICROLLM_EXPECT_CLOSE(embedding_backward(g, ids, 3), ref, tolerance(DType::f32));
  // Zero-width rows.
  EXPECT_EQ(embedding_backward(Tensor::zeros({4, 0}, DType::f32, device()), ids, 3).shape(), (Shape{3, 0}));
  EXPECT_EQ(embedding(Tensor::zeros({3, 0}, DType::f32, device()), ids).shape(), (Shape{4, 0}));
  // Errors.
  expect_index_error(device(), [&] { embedding_backward(g, ids, 2); }, device().is_cpu() ? "embedding_backward" : "embedding",
                     {"position 0"}, "2");
  expect_op_error<ShapeError>([&] { embedding_backward(g.view({2, 2, 300}), ids, 3); }, "embedding_backward");
  expect_op_error<ShapeError>([&] { embedding_backward(g.narrow(0, 0, 3), ids, 3); }, "embedding_backward");
  expect_op_error<DTypeError>(
      [&] {
        embedding_backward(Tensor::zeros({4, 3}, DType::i32, device()), ids, 3);
      },
      "embedding_backward");
}

TEST_P(IndexingTest, EmbeddingGradientsMatchFiniteDifferences) {
  if (!device().is_cpu()) GTEST_SKIP() << "gradcheck runs in f64 on the CPU";
  const Tensor weight = random_tensor({6, 4}, DType::f64);
  for (DType id_dtype : {DType::i32, DType::i64}) {
    const Tensor ids = ids_tensor({5, 1, 5, 5, 0, 1}, {3, 2}, id_dtype, Device::cpu());
    testing::expect_gradients_match(
        {weight}, [&](const std::vector<Tensor>& in) { return embedding(in[0], ids); },
        [&](const std::vector<Tensor>&, const Tensor& g) {
          return std::vector<Tensor>{embedding_backward(g, ids, 6)};
        });
  }
}

// ---- concat / split ----

TEST_P(IndexingTest, ConcatJoinsAlongAnyDim) {
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::u8}) {
    const Tensor a = random_tensor({2, 3, 4}, dtype, device(), 0, 50);
    const Tensor b = random_tensor({2, 5, 4}, dtype, device(), 0, 50);
    const Tensor c = random_tensor({2, 0, 4}, dtype, device(), 0, 50);
    const Tensor d = random_tensor({4, 1, 2}, dtype, device(), 0, 50).permute({2, 1, 0});  // [2, 1, 4], strided
    const Tensor out = concat({a, testing::non_contiguous(b), c, d}, -2);
    ASSERT_EQ(out.shape(), (Shape{2, 9, 4}));
    ASSERT_EQ(out.dtype(), dtype);
    const std::vector<double> av = host_values(a), bv = host_values(b), dv = host_values(d);
    std::vector<double> ref;
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k) ref.push_back(av[static_cast<size_t>((i * 3 + j) * 4 + k)]);
      for (int j = 0; j < 5; ++j)
        for (int k = 0; k < 4; ++k) ref.push_back(bv[static_cast<size_t>((i * 5 + j) * 4 + k)]);
      for (int k = 0; k < 4; ++k) ref.push_back(dv[static_cast<size_t>(i * 4 + k)]);
    }
    EXPECT_EQ(host_values(out), ref) << dtype;
    // Along the first and the last dim.
    EXPECT_EQ(host_values(concat({a, a}, 0)).size(), 48u);
    const Tensor last = concat({a, a.narrow(2, 1, 2)}, 2);
    ASSERT_EQ(last.shape(), (Shape{2, 3, 6}));
    EXPECT_EQ(host_values(last.narrow(2, 4, 2)), host_values(a.narrow(2, 1, 2)));
    EXPECT_EQ(host_values(concat({a}, 1)), av);
  }
}

TEST_P(IndexingTest, ConcatContractErrors) {
  const Tensor a = random_tensor({2, 3}, DType::f32, device());
  expect_op_error<ValueError>([&] { concat({}, 0); }, "concat");
  expect_op_error<DTypeError>([&] { concat({a, a.to(DType::f16)}, 0); }, "concat", {"tensor 1", "f16"});
  expect_op_error<ShapeError>(
      [&] {
        concat({a, random_tensor({2, 4}, DType::f32, device())}, 0);
      },
      "concat", {"tensor 1", "[2, 4]", "[2, 3]"});
  expect_op_error<ShapeError>([&] { concat({a, random_tensor({6}, DType::f32, device())}, 0); }, "concat");
  expect_op_error<IndexError>([&] { concat({a, a}, 2); }, "concat");
  expect_op_error<ValueError>([&] { concat({a, Tensor()}, 0); }, "concat");
}

TEST_P(IndexingTest, SplitGivesViewsOfTheRightPieces) {
  const Tensor x = random_tensor({3, 10}, DType::f32, device());
  const std::vector<Tensor> pieces = split(x, {4, 0, 5, 1}, -1);
  ASSERT_EQ(pieces.size(), 4u);
  int64_t start = 0;
  for (const Tensor& p : pieces) {
    EXPECT_TRUE(p.shares_storage_with(x));
    EXPECT_EQ(p.size(0), 3);
    EXPECT_EQ(host_values(p), host_values(x.narrow(1, start, p.size(1))));
    start += p.size(1);
  }
  EXPECT_EQ(pieces[2].shape(), (Shape{3, 5}));
  EXPECT_EQ(host_values(concat(pieces, 1)), host_values(x));
  expect_op_error<ShapeError>([&] { split(x, {4, 5}, 1); }, "split", {"9", "10"});
  expect_op_error<ValueError>([&] { split(x, {-1, 11}, 1); }, "split");
  expect_op_error<IndexError>([&] { split(x, {3}, 2); }, "split");
}

TEST_P(IndexingTest, ConcatAndSplitGradientsMatchFiniteDifferences) {
  if (!device().is_cpu()) GTEST_SKIP() << "gradcheck runs in f64 on the CPU";
  const Tensor a = random_tensor({2, 3, 2}, DType::f64), b = random_tensor({2, 1, 2}, DType::f64),
               c = random_tensor({2, 4, 2}, DType::f64);
  testing::expect_gradients_match(
      {a, b, c}, [&](const std::vector<Tensor>& in) { return concat(in, 1); },
      [&](const std::vector<Tensor>& in, const Tensor& g) {
        std::vector<Tensor> grads = concat_backward(g, {in[0].size(1), in[1].size(1), in[2].size(1)}, 1);
        for (const Tensor& t : grads) EXPECT_TRUE(t.is_contiguous());
        return grads;
      });
  // split: each piece in turn is the output; the others get zero gradients.
  const Tensor x = random_tensor({3, 7}, DType::f64);
  const std::vector<int64_t> sizes = {2, 4, 1};
  for (size_t piece = 0; piece < sizes.size(); ++piece) {
    testing::expect_gradients_match(
        {x}, [&](const std::vector<Tensor>& in) { return split(in[0], sizes, -1)[piece]; },
        [&](const std::vector<Tensor>&, const Tensor& g) {
          std::vector<Tensor> grads;
          for (size_t k = 0; k < sizes.size(); ++k)
            grads.push_back(k == piece ? g : Tensor::zeros({3, sizes[k]}, DType::f64));
          return std::vector<Tensor>{split_backward(grads, -1)};
        });
  }
}

// ---- topk ----

// The k largest of each row of `values` ([rows, n]): descending, NaN largest, ties lower index first.
void reference_topk(const std::vector<double>& values, int64_t rows, int64_t n, int64_t k, std::vector<double>* top,
                    std::vector<double>* index) {
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    auto v = [&](int64_t i) { return values[static_cast<size_t>(r * n + i)]; };
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      if (std::isnan(v(a)) || std::isnan(v(b))) return std::isnan(v(a)) && !std::isnan(v(b));
      return v(a) > v(b);
    });
    for (int64_t j = 0; j < k; ++j) {
      top->push_back(v(order[static_cast<size_t>(j)]));
      index->push_back(static_cast<double>(order[static_cast<size_t>(j)]));
    }
  }
}

TEST_P(IndexingTest, TopkMatchesReference) {
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    // Integers from a small range: plenty of ties.
    const Tensor x = is_floating(dtype) ? random_tensor({3, 4, 9}, dtype, device())
                                        : random_tensor({3, 4, 9}, dtype, device(), -4, 4);
    for (const Tensor& input : {x, testing::non_contiguous(x), x.transpose(0, 1)}) {
      const std::vector<double> v = host_values(input);
      const int64_t rows = input.numel() / 9;
      for (int64_t k : {0, 1, 4, 9}) {
        const TopK result = topk(input, k);
        Shape shape = input.shape();
        shape[2] = k;
        ASSERT_EQ(result.values.shape(), shape);
        ASSERT_EQ(result.indices.shape(), shape);
        ASSERT_EQ(result.values.dtype(), dtype);
        ASSERT_EQ(result.indices.dtype(), DType::i64);
        std::vector<double> top, index;
        reference_topk(v, rows, 9, k, &top, &index);
        EXPECT_EQ(host_values(result.values), top) << dtype << " k " << k;
        EXPECT_EQ(host_values(result.indices), index) << dtype << " k " << k;
      }
    }
  }
}

TEST_P(IndexingTest, TopkTiesNaNAndEdges) {
  const Tensor x = Tensor::from_vector<float>({2, 5, NAN, 5, 1, NAN, 2, -INFINITY}, {8}).to(device());
  const TopK all = topk(x, 8);
  EXPECT_EQ(all.indices.to_vector<int64_t>(), (std::vector<int64_t>{2, 5, 1, 3, 0, 6, 4, 7}));
  const std::vector<float> values = all.values.to_vector<float>();
  EXPECT_TRUE(std::isnan(values[0]) && std::isnan(values[1]));
  EXPECT_EQ(std::vector<float>(values.begin() + 2, values.end()), (std::vector<float>{5, 5, 2, 2, 1, -INFINITY}));
  EXPECT_EQ(topk(x, 3).indices.to_vector<int64_t>(), (std::vector<int64_t>{2, 5, 1}));
  const Tensor ties = Tensor::full({2, 6}, 3.0, DType::f32, device());
  EXPECT_EQ(topk(ties, 4).indices.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(topk(ties, 0).values.shape(), (Shape{2, 0}));
  EXPECT_EQ(topk(Tensor::zeros({0, 5}, DType::f32, device()), 2).values.shape(), (Shape{0, 2}));
  EXPECT_EQ(topk(Tensor::zeros({3, 0}, DType::f32, device()), 0).indices.shape(), (Shape{3, 0}));
  expect_op_error<ValueError>([&] { topk(ties, 7); }, "topk", {"k = 7"});
  expect_op_error<ValueError>([&] { topk(ties, -1); }, "topk");
  expect_op_error<ShapeError>([&] { topk(Tensor::scalar(1, DType::f32, device()), 1); }, "topk");
}

TEST_P(IndexingTest, TopkOnManyStridedRowsWithThreads) {
  // Many rows whose starts do not merge into one stride: the row table must stay in row order when the
  // threads fill it.
  const Tensor x = random_tensor({300, 300, 3}, DType::f32, device()).transpose(0, 1);  // [300, 300, 3]
  set_num_threads(4);
  const TopK result = topk(x, 2);
  set_num_threads(0);
  std::vector<double> top, index;
  reference_topk(host_values(x), 300 * 300, 3, 2, &top, &index);
  EXPECT_EQ(host_values(result.values), top);
  EXPECT_EQ(host_values(result.indices), index);
}

TEST_P(IndexingTest, TopkGradientsMatchFiniteDifferences) {
  if (!device().is_cpu()) GTEST_SKIP() << "gradcheck runs in f64 on the CPU";
  const Tensor x = random_tensor({3, 7}, DType::f64);  // distinct values: the selection is stable
  for (int64_t k : {1, 3, 7}) {
    testing::expect_gradients_match(
        {x}, [&](const std::vector<Tensor>& in) { return topk(in[0], k).values; },
        [&](const std::vector<Tensor>& in, const Tensor& g) {
          return std::vector<Tensor>{topk_backward(g, topk(in[0], k).indices, in[0].shape())};
        });
  }
}

// ---- scatter_add ----

TEST_P(IndexingTest, ScatterAddAccumulatesRepeatedIndices) {
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    const bool integral = is_integral(dtype);
    const Tensor x = random_tensor({4, 5, 3}, dtype, device(), integral ? -9 : -1, integral ? 9 : 1);
    for (int dim = 0; dim < 3; ++dim) {
      Shape src_shape = x.shape();
      src_shape[dim] = 6;  // more sources than slots: indices repeat
      const Tensor src = random_tensor(src_shape, dtype, device(), integral ? -9 : -1, integral ? 9 : 1);
      const Tensor index = random_tensor(src_shape, DType::i64, device(), 0, static_cast<double>(x.size(dim)));
      for (const auto& [s, idx] : {std::pair{src, index}, std::pair{testing::non_contiguous(src), index},
                                   std::pair{src, testing::non_contiguous(index)}}) {
        const Tensor out = scatter_add(x, dim - 3, idx, s);
        ASSERT_EQ(out.shape(), x.shape());
        ASSERT_EQ(out.dtype(), dtype);
        std::vector<double> ref = host_values(x);
        const std::vector<double> sv = host_values(s), iv = host_values(idx);
        for (int64_t flat = 0; flat < s.numel(); ++flat) {
          int64_t i[3];  // the source position, then its target: index replaces the coordinate along dim
          for (int64_t d = 2, rest = flat; d >= 0; --d) {
            i[d] = rest % src_shape[static_cast<int>(d)];
            rest /= src_shape[static_cast<int>(d)];
          }
          i[dim] = static_cast<int64_t>(iv[static_cast<size_t>(flat)]);
          ref[static_cast<size_t>((i[0] * 5 + i[1]) * 3 + i[2])] += sv[static_cast<size_t>(flat)];
        }
        MICROLLM_EXPECT_CLOSE(out, ref, integral ? 0.0 : tolerance(dtype)) << dtype << " dim " << dim;
      }
    }
    // x itself is not modified.
    const std::vector<double> before = host_values(x);
    scatter_add(x, 0, Tensor::zeros({1, 5, 3}, DType::i64, device()), Tensor::ones({1, 5, 3}, dtype, device()));
    EXPECT_EQ(host_values(x), before);
  }
}

TEST_P(IndexingTest, ScatterAddContractErrors) {
  const Tensor x = Tensor::zeros({3, 4}, DType::f32, device());
  const Tensor src = Tensor::ones({2, 4}, DType::f32, device());
  const Tensor index = Tensor::zeros({2, 4}, DType::i64, device());
  expect_index_error(
      device(), [&] { scatter_add(x, 0, ids_tensor({0, 1, 2, 3, 0, 0, 0, 0}, {2, 4}, DType::i64, device()), src); },
      "scatter_add", {"position 3", "[0, 3)"}, "3");
  expect_op_error<DTypeError>([&] { scatter_add(x, 0, index.to(DType::i32), src); }, "scatter_add");
  expect_op_error<DTypeError>([&] { scatter_add(x, 0, index, src.to(DType::f64)); }, "scatter_add");
  expect_op_error<ShapeError>([&] { scatter_add(x, 0, index.narrow(1, 0, 3), src); }, "scatter_add");
  expect_op_error<ShapeError>([&] { scatter_add(x, 1, index, src); }, "scatter_add");
  expect_op_error<ShapeError>([&] { scatter_add(x, 0, index.view({8}), src.view({8})); }, "scatter_add");
  expect_op_error<IndexError>([&] { scatter_add(x, 2, index, src); }, "scatter_add");
}

INSTANTIATE_TEST_SUITE_P(Devices, IndexingTest, ::testing::ValuesIn(testing::test_devices()),
                         testing::device_test_name);

}  // namespace
}  // namespace microllm
