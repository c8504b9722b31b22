// Tensor views checked against an independent index model on random shapes and known compositions, their
// metadata, and their argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "microllm/core/tensor.h"
#include "test_support.h"

namespace microllm {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The message of the E that `fn` throws ("no error" if none: the checks on it then fail).
template <typename E, typename Fn>
std::string error_message(Fn&& fn) {
  return testing::message_of<E>(std::forward<Fn>(fn));
}

// ---------------------------------------------------------------------------------------------------
// Views against an index model.
//
// The model knows, for every position of a view, which element of the base it shows (`value`: the base
// is arange, so the value is the base index) and which element of the current storage it reads (`pos`;
// it differs from `value` only after reshape had to copy). Each view op is modelled as a map from new
// positions to old positions, written here from the op's definition, never from strides.

using Index = std::vector<int64_t>;
using IndexFn = std::function<int64_t(const Index&)>;

struct Model {
  Index shape;
  IndexFn value;
  IndexFn pos;
  bool copied = false;
};

int64_t count_of(const Index& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

void for_each_index(const Index& shape, const std::function<void(const Index&)>& fn) {
  if (count_of(shape) == 0) return;
  Index i(shape.size(), 0);
  for (;;) {
    fn(i);
    int d = static_cast<int>(shape.size()) - 1;
    for (; d >= 0; --d) {
      if (++i[static_cast<size_t>(d)] < shape[static_cast<size_t>(d)]) break;
      i[static_cast<size_t>(d)] = 0;
    }
    if (d < 0) return;
  }
}

int64_t row_major(const Index& shape, const Index& i) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + i[d];
  return flat;
}

Index unflatten(const Index& shape, int64_t flat) {
  Index i(shape.size(), 0);
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    i[static_cast<size_t>(d)] = flat % shape[static_cast<size_t>(d)];
    flat /= shape[static_cast<size_t>(d)];
  }
  return i;
}

Model remap(const Model& m, const Index& shape, std::function<Index(const Index&)> to_old) {
  Model out;
  out.shape = shape;
  out.copied = m.copied;
  out.value = [value = m.value, to_old](const Index& i) { return value(to_old(i)); };
  out.pos = [pos = m.pos, to_old](const Index& i) { return pos(to_old(i)); };
  return out;
}

// Whether some strides and offset address exactly the model's storage positions.
bool is_affine(const Model& m) {
  if (count_of(m.shape) == 0) return true;
  const Index zero(m.shape.size(), 0);
  const int64_t origin = m.pos(zero);
  Index strides(m.shape.size(), 0);
  for (size_t d = 0; d < m.shape.size(); ++d) {
    if (m.shape[d] < 2) continue;
    Index e = zero;
    e[d] = 1;
    strides[d] = m.pos(e) - origin;
  }
  bool affine = true;
  for_each_index(m.shape, [&](const Index& i) {
    int64_t p = origin;
    for (size_t d = 0; d < i.size(); ++d) p += i[d] * strides[d];
    if (p != m.pos(i)) affine = false;
  });
  return affine;
}

bool model_is_row_major(const Model& m) {
  if (count_of(m.shape) == 0) return true;
  const int64_t origin = m.pos(Index(m.shape.size(), 0));
  bool ok = true;
  for_each_index(m.shape, [&](const Index& i) { ok = ok && m.pos(i) == origin + row_major(m.shape, i); });
  return ok;
}

void expect_matches_model(const Tensor& t, const Model& m, const Tensor& base) {
  ASSERT_EQ(t.shape().to_vector(), m.shape);
  std::vector<double> expected;
  for_each_index(m.shape, [&](const Index& i) { expected.push_back(static_cast<double>(m.value(i))); });
  ASSERT_EQ(t.to_vector<double>(), expected);
  // The strides and offset address exactly the modelled storage element.
  for_each_index(m.shape, [&](const Index& i) {
    int64_t p = t.offset();
    for (size_t d = 0; d < i.size(); ++d) p += i[d] * t.stride(static_cast<int64_t>(d));
    ASSERT_EQ(p, m.pos(i));
  });
  EXPECT_EQ(t.shares_storage_with(base), !m.copied);
  EXPECT_EQ(t.is_contiguous(), model_is_row_major(m));
}

struct ViewFuzzer {
  std::mt19937_64 rng;
  std::string trace;

  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }
  bool coin() { return uniform(0, 1) == 1; }

  // Applies `reshape` (or flatten, which is a reshape) and checks that it copies exactly when no view
  // can express the new shape.
  void reshape_step(Tensor& t, Model& m, const Index& target, const Tensor& result, bool tried_view, bool viewed) {
    Model as_view = remap(m, target, [old_shape = m.shape, target](const Index& i) {
      return unflatten(old_shape, row_major(target, i));
    });
    const bool possible = is_affine(as_view);
    const bool copied = !result.shares_storage_with(t);
    EXPECT_EQ(copied, !possible) << trace << ": reshape copied=" << copied << " but a view is "
                                 << (possible ? "possible" : "impossible");
    if (tried_view) {
      EXPECT_EQ(viewed, possible) << trace << ": view() disagrees with the model";
    }
    if (copied) {
      as_view.copied = true;
      as_view.pos = [target](const Index& i) { return row_major(target, i); };
    }
    t = result;
    m = as_view;
  }

  void step(Tensor& t, Model& m) {
    const int r = static_cast<int>(m.shape.size());
    auto sz = [&](int d) { return m.shape[static_cast<size_t>(d)]; };
    const int64_t n = count_of(m.shape);
    switch (uniform(0, 11)) {
      case 0: {  // transpose
        if (r == 0) return;
        const int64_t a = uniform(-r, r - 1), b = uniform(-r, r - 1);
        const int na = static_cast<int>(a < 0 ? a + r : a), nb = static_cast<int>(b < 0 ? b + r : b);
        trace += " transpose(" + std::to_string(a) + "," + std::to_string(b) + ")";
        Index shape = m.shape;
        std::swap(shape[static_cast<size_t>(na)], shape[static_cast<size_t>(nb)]);
        t = t.transpose(a, b);
        m = remap(m, shape, [na, nb](Index i) {
          std::swap(i[static_cast<size_t>(na)], i[static_cast<size_t>(nb)]);
          return i;
        });
        return;
      }
      case 1: {  // permute
        Index perm(static_cast<size_t>(r));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        Dims order;
        Index shape;
        trace += " permute(";
        for (int i = 0; i < r; ++i) {
          const int64_t p = perm[static_cast<size_t>(i)];
          order.push_back(coin() ? p - r : p);  // negative dims too
          shape.push_back(m.shape[static_cast<size_t>(p)]);
          trace += std::to_string(order[i]) + ",";
        }
        trace += ")";
        t = t.permute(order);
        m = remap(m, shape, [perm](const Index& i) {
          Index old(i.size());
          for (size_t k = 0; k < i.size(); ++k) old[static_cast<size_t>(perm[k])] = i[k];
          return old;
        });
        return;
      }
      case 2: {  // slice, Python semantics
        if (r == 0) return;
        const int d = static_cast<int>(uniform(0, r - 1));
        const int64_t size = sz(d);
        const int64_t start = uniform(-size - 2, size + 2), end = uniform(-size - 2, size + 2), step = uniform(1, 3);
        auto clamp = [size](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + size : i, 0, size); };
        const int64_t lo = clamp(start), hi = std::max(lo, clamp(end));
        Index shape = m.shape;
        shape[static_cast<size_t>(d)] = (hi - lo + step - 1) / step;
        trace += " slice(" + std::to_string(d - r) + "," + std::to_string(start) + "," + std::to_string(end) + "," +
                 std::to_string(step) + ")";
        t = t.slice(d - r, start, end, step);
        m = remap(m, shape, [d, lo, step](Index i) {
          i[static_cast<size_t>(d)] = lo + i[static_cast<size_t>(d)] * step;
          return i;
        });
        return;
      }
      case 3: {  // narrow
        if (r == 0) return;
        const int d = static_cast<int>(uniform(0, r - 1));
        const int64_t length = uniform(0, sz(d));
        const int64_t start = uniform(0, sz(d) - length);
        const int64_t start_arg = (coin() && start < sz(d)) ? start - sz(d) : start;
        trace += " narrow(" + std::to_string(d) + "," + std::to_string(start_arg) + "," + std::to_string(length) + ")";
        Index shape = m.shape;
        shape[static_cast<size_t>(d)] = length;
        t = t.narrow(d, start_arg, length);
        m = remap(m, shape, [d, start](Index i) {
          i[static_cast<size_t>(d)] += start;
          return i;
        });
        return;
      }
      case 4: {  // select
        if (r == 0) return;
        const int d = static_cast<int>(uniform(0, r - 1));
        if (sz(d) == 0) return;
        const int64_t index = uniform(0, sz(d) - 1);
        const int64_t index_arg = coin() ? index - sz(d) : index;
        trace += " select(" + std::to_string(d) + "," + std::to_string(index_arg) + ")";
        Index shape = m.shape;
        shape.erase(shape.begin() + d);
        t = t.select(d, index_arg);
        m = remap(m, shape, [d, index](Index i) {
          i.insert(i.begin() + d, index);
          return i;
        });
        return;
      }
      case 5: {  // unsqueeze
        if (r >= 6) return;
        const int64_t d = uniform(-(r + 1), r);
        const int nd = static_cast<int>(d < 0 ? d + r + 1 : d);
        trace += " unsqueeze(" + std::to_string(d) + ")";
        Index shape = m.shape;
        shape.insert(shape.begin() + nd, 1);
        t = t.unsqueeze(d);
        m = remap(m, shape, [nd](Index i) {
          i.erase(i.begin() + nd);
          return i;
        });
        return;
      }
      case 6: {  // squeeze, all or one dim
        if (coin() && r > 0) {
          const int d = static_cast<int>(uniform(0, r - 1));
          trace += " squeeze(" + std::to_string(d) + ")";
          t = t.squeeze(d);
          if (sz(d) != 1) return;
          Index shape = m.shape;
          shape.erase(shape.begin() + d);
          m = remap(m, shape, [d](Index i) {
            i.insert(i.begin() + d, 0);
            return i;
          });
          return;
        }
        trace += " squeeze()";
        Index shape, kept;
        for (int d = 0; d < r; ++d) {
          if (sz(d) != 1) {
            shape.push_back(sz(d));
            kept.push_back(d);
          }
        }
        t = t.squeeze();
        m = remap(m, shape, [kept, r](const Index& i) {
          Index old(static_cast<size_t>(r), 0);
          for (size_t k = 0; k < kept.size(); ++k) old[static_cast<size_t>(kept[k])] = i[k];
          return old;
        });
        return;
      }
      case 7: {  // expand size-1 dims, maybe with a new leading dim
        if (r >= 6 || n > 300) return;
        const bool lead = coin();
        Dims target;
        Index shape;
        if (lead) {
          const int64_t s = uniform(1, 3);
          target.push_back(s);
          shape.push_back(s);
        }
        for (int d = 0; d < r; ++d) {
          if (sz(d) == 1) {
            const int64_t s = uniform(1, 3);
            target.push_back(s);
            shape.push_back(s);
          } else {
            target.push_back(coin() ? -1 : sz(d));
            shape.push_back(sz(d));
          }
        }
        trace += " expand(" + target.str() + ")";
        t = t.expand(target);
        m = remap(m, shape, [lead, old_shape = m.shape](Index i) {
          if (lead) i.erase(i.begin());
          for (size_t d = 0; d < i.size(); ++d) {
            if (old_shape[d] == 1) i[d] = 0;
          }
          return i;
        });
        return;
      }
      case 8: {  // flatten
        if (r == 0) return;
        const int64_t s = uniform(0, r - 1), e = uniform(s, r - 1);
        const int64_t s_arg = coin() ? s - r : s, e_arg = coin() ? e - r : e;
        trace += " flatten(" + std::to_string(s_arg) + "," + std::to_string(e_arg) + ")";
        Index target;
        for (int64_t d = 0; d < s; ++d) target.push_back(sz(static_cast<int>(d)));
        int64_t merged = 1;
        for (int64_t d = s; d <= e; ++d) merged *= sz(static_cast<int>(d));
        target.push_back(merged);
        for (int64_t d = e + 1; d < r; ++d) target.push_back(sz(static_cast<int>(d)));
        const Tensor result = t.flatten(s_arg, e_arg);
        reshape_step(t, m, target, result, false, false);
        return;
      }
      default: {  // view / reshape: merge two adjacent dims, split one, or flatten all with -1
        Index target = m.shape;
        const int64_t kind = uniform(0, 2);
        if (kind == 0 && r >= 2) {
          const int d = static_cast<int>(uniform(0, r - 2));
          target[static_cast<size_t>(d)] *= target[static_cast<size_t>(d) + 1];
          target.erase(target.begin() + d + 1);
        } else if (kind == 1 && r >= 1 && r < 6) {
          const int d = static_cast<int>(uniform(0, r - 1));
          Index divisors;
          for (int64_t f = 1; f <= std::max<int64_t>(sz(d), 1); ++f) {
            if (sz(d) % f == 0) divisors.push_back(f);
          }
          const int64_t f = divisors[static_cast<size_t>(uniform(0, static_cast<int64_t>(divisors.size()) - 1))];
          target[static_cast<size_t>(d)] = f;
          target.insert(target.begin() + d + 1, f == 0 ? 0 : sz(d) / f);
        } else {
          target = {n};
        }
        Dims request(target);
        if (n > 0 && !target.empty() && coin()) request[static_cast<int>(uniform(0, request.size() - 1))] = -1;
        trace += " reshape(" + request.str() + ")";
        bool viewed = true;
        try {
          const Tensor v = t.view(request);
          EXPECT_TRUE(v.shares_storage_with(t)) << trace;
        } catch (const ShapeError&) {
          viewed = false;
        }
        const Tensor result = t.reshape(request);
        reshape_step(t, m, target, result, true, viewed);
        return;
      }
    }
  }
};

TEST(TensorViews, RandomCompositionsMatchTheIndexModel) {
  const uint64_t seed = testing::fresh_seed();
  ViewFuzzer fuzz{std::mt19937_64(seed), ""};
  for (int trial = 0; trial < 300; ++trial) {
    Index shape;
    const int64_t rank = fuzz.uniform(0, 4);
    for (int64_t d = 0; d < rank; ++d) shape.push_back(fuzz.uniform(0, 20) == 0 ? 0 : fuzz.uniform(1, 5));
    const Tensor base = Tensor::arange(static_cast<double>(count_of(shape)), DType::f64).view(Dims(shape));
    Tensor t = base;
    Model m{shape, [shape](const Index& i) { return row_major(shape, i); },
            [shape](const Index& i) { return row_major(shape, i); }, false};
    fuzz.trace = "seed " + std::to_string(seed) + " trial " + std::to_string(trial) + ": " + Dims(shape).str();
    for (int s = 0; s < 8; ++s) {
      fuzz.step(t, m);
      SCOPED_TRACE(fuzz.trace);
      expect_matches_model(t, m, base);
      if (::testing::Test::HasFailure()) return;
    }
    // contiguous() copies exactly when needed; clone() always copies; both keep the values.
    SCOPED_TRACE(fuzz.trace);
    const Tensor c = t.contiguous();
    EXPECT_TRUE(c.is_contiguous());
    EXPECT_EQ(c.shares_storage_with(t), model_is_row_major(m));
    EXPECT_EQ(c.to_vector<double>(), t.to_vector<double>());
    const Tensor k = t.clone();
    EXPECT_TRUE(k.is_contiguous());
    EXPECT_FALSE(k.shares_storage_with(t));
    EXPECT_EQ(k.to_vector<double>(), t.to_vector<double>());
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(TensorViews, KnownCompositions) {
  const Tensor base = Tensor::arange(24, DType::i64).view({2, 3, 4});
  // Slice of a transpose.
  const Tensor st = base.transpose(0, 2).slice(0, 1, 4, 2);  // [2, 3, 2]: k in {1, 3}
  EXPECT_EQ(st.shape(), (Shape{2, 3, 2}));
  std::vector<int64_t> expected;
  for (int64_t k : {1, 3})
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t i = 0; i < 2; ++i) expected.push_back(i * 12 + j * 4 + k);
  EXPECT_EQ(st.to_vector<int64_t>(), expected);
  EXPECT_TRUE(st.shares_storage_with(base));
  // View of a view.
  const Tensor vv = base.view({6, 4}).view({4, 6}).view({-1});
  EXPECT_EQ(vv.to_vector<int64_t>(), base.to_vector<int64_t>());
  EXPECT_TRUE(vv.shares_storage_with(base));
  // A transposed tensor cannot be viewed flat; reshape copies.
  EXPECT_THROW(base.transpose(1, 2).view({-1}), ShapeError);
  const std::string message = error_message<ShapeError>([&] { base.transpose(1, 2).view({-1}); });
  EXPECT_TRUE(contains(message, "[view]")) << message;
  EXPECT_TRUE(contains(message, "reshape")) << message;
  const Tensor flat = base.transpose(1, 2).reshape({-1});
  EXPECT_FALSE(flat.shares_storage_with(base));
  EXPECT_EQ(flat.to_vector<int64_t>()[1], 4);
  // Splitting or merging dims that stay contiguous is a view even on a strided tensor.
  const Tensor strided = base.slice(2, 0, 4, 2);  // [2, 3, 2]
  EXPECT_TRUE(strided.view({6, 2}).shares_storage_with(base));
  EXPECT_EQ(strided.view({12}).strides(), (Strides{2}));  // every step is 2 elements: still one stride
  const Tensor cut = base.slice(2, 0, 3);                 // [2, 3, 3], strides [12, 4, 1]
  EXPECT_EQ(cut.view({6, 3}).strides(), (Strides{4, 1}));
  EXPECT_THROW(cut.view({18}), ShapeError);
  EXPECT_THROW(cut.view({2, 9}), ShapeError);
  EXPECT_TRUE(base.transpose(0, 1).view({3, 2, 2, 2}).shares_storage_with(base));
  // Expand then view: the broadcast dim cannot merge with its neighbour.
  const Tensor row = Tensor::arange(3, DType::i64).view({1, 3}).expand({4, 3});
  EXPECT_EQ(row.stride(0), 0);
  EXPECT_THROW(row.view({12}), ShapeError);
  EXPECT_EQ(row.reshape({12}).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2}));
  EXPECT_TRUE(row.view({4, 1, 3}).shares_storage_with(row));
  // narrow / select / unsqueeze / squeeze / flatten / permute compose.
  const Tensor c = base.narrow(1, 1, 2).select(2, -1).unsqueeze(0).permute({2, 0, 1}).squeeze();  // [2, 2]
  EXPECT_EQ(c.shape(), (Shape{2, 2}));
  EXPECT_EQ(c.to_vector<int64_t>(), (std::vector<int64_t>{7, 19, 11, 23}));
  EXPECT_EQ(base.flatten(1).shape(), (Shape{2, 12}));
  EXPECT_EQ(base.flatten(0, 1).shape(), (Shape{6, 4}));
  EXPECT_EQ(Tensor::scalar(3).flatten().shape(), (Shape{1}));
  EXPECT_EQ(base.select(0, 1).select(0, 2).select(0, 3).item<int64_t>(), 23);
  EXPECT_EQ(base.select(0, 1).select(0, 2).select(0, 3).dim(), 0);
  // Python slicing: negative bounds and clamping.
  const Tensor v = Tensor::arange(10, DType::i64);
  EXPECT_EQ(v.slice(0, -3, 100).to_vector<int64_t>(), (std::vector<int64_t>{7, 8, 9}));
  EXPECT_EQ(v.slice(0, -100, 3).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(v.slice(0, 1, 10, 4).to_vector<int64_t>(), (std::vector<int64_t>{1, 5, 9}));
  EXPECT_EQ(v.slice(0, 7, 3).numel(), 0);
  EXPECT_EQ(v.slice(0, 10, 20).numel(), 0);
  // t() and expand with -1 and new leading dims.
  EXPECT_EQ(base.select(0, 0).t().shape(), (Shape{4, 3}));
  const Tensor e = Tensor::arange(3, DType::i64).view({3, 1}).expand({2, -1, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Strides{0, 1, 0}));
  EXPECT_EQ(Tensor::arange(3, DType::i64).broadcast_to({2, 3}).to_vector<int64_t>(),
            (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
}

TEST(TensorViews, Metadata) {
  const Tensor t = Tensor::zeros({2, 3, 5}, DType::f16);
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 30);
  EXPECT_EQ(t.size(-1), 5);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.stride(0), 15);
  EXPECT_EQ(t.stride(-2), 5);
  EXPECT_EQ(t.element_size(), 2u);
  EXPECT_EQ(t.nbytes(), 60u);
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_TRUE(t.defined());
  EXPECT_FALSE(Tensor().defined());
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_FALSE(t.transpose(0, 1).is_contiguous());
  EXPECT_TRUE(t.narrow(0, 1, 1).is_contiguous());  // a contiguous block with an offset
  EXPECT_FALSE(t.narrow(2, 1, 2).is_contiguous());
  EXPECT_TRUE(t.narrow(2, 1, 0).is_contiguous());  // empty
  EXPECT_TRUE(t.unsqueeze(1).is_contiguous());
  EXPECT_EQ(static_cast<char*>(t.narrow(0, 1, 1).data_ptr()) - static_cast<char*>(t.data_ptr()), 30);
}

TEST(TensorViews, ArgumentErrors) {
  const Tensor t = Tensor::arange(24, DType::f32).view({2, 3, 4});
  EXPECT_THROW(t.slice(0, 0, 2, -1), ValueError);
  EXPECT_THROW(t.slice(0, 0, 2, 0), ValueError);
  EXPECT_THROW(t.slice(3, 0, 2), IndexError);
  EXPECT_THROW(t.narrow(1, 2, 2), IndexError);
  EXPECT_THROW(t.narrow(1, -4, 1), IndexError);
  EXPECT_THROW(t.narrow(1, 0, -1), IndexError);
  EXPECT_THROW(t.narrow(-4, 0, 1), IndexError);
  const std::string narrow_message = error_message<IndexError>([&] { t.narrow(1, 2, 2); });
  EXPECT_TRUE(contains(narrow_message, "[narrow]")) << narrow_message;
  EXPECT_TRUE(contains(narrow_message, "[2, 3, 4]")) << narrow_message;
  EXPECT_THROW(t.select(1, 3), IndexError);
  EXPECT_THROW(t.select(1, -4), IndexError);
  EXPECT_TRUE(contains(error_message<IndexError>([&] { t.select(2, 9); }), "[select]"));
  EXPECT_THROW(t.view({5, -1}), ShapeError);
  EXPECT_THROW(t.view({-1, -1}), ShapeError);
  EXPECT_THROW(t.view({25}), ShapeError);
  EXPECT_THROW(t.view({-2, 12}), ShapeError);
  EXPECT_THROW(t.reshape({7, -1}), ShapeError);
  EXPECT_THROW(t.permute({0, 1}), ShapeError);
  EXPECT_THROW(t.permute({0, 1, 1}), ShapeError);
  EXPECT_THROW(t.permute({0, 1, 3}), IndexError);
  EXPECT_THROW(t.transpose(0, 3), IndexError);
  EXPECT_THROW(t.t(), ShapeError);
  EXPECT_THROW(t.expand({2, 5, 4}), ShapeError);
  EXPECT_THROW(t.expand({3, 4}), ShapeError);
  EXPECT_THROW(t.expand({-1, 2, 3, 4}), ShapeError);
  EXPECT_THROW(t.flatten(2, 1), IndexError);
  EXPECT_THROW(t.size(3), IndexError);
  EXPECT_THROW(t.stride(-4), IndexError);
  EXPECT_THROW(t.squeeze(3), IndexError);
  EXPECT_THROW(t.unsqueeze(4), IndexError);
  EXPECT_THROW(Tensor::zeros({1, 1, 1, 1, 1, 1, 1, 1}).unsqueeze(0), ShapeError);
  EXPECT_THROW(Tensor().data_ptr(), ValueError);
  // data<T>() checks the dtype and names both.
  const std::string data_message = error_message<DTypeError>([&] { (void)t.data<double>(); });
  EXPECT_TRUE(contains(data_message, "[data]")) << data_message;
  EXPECT_TRUE(contains(data_message, "f64")) << data_message;
  EXPECT_TRUE(contains(data_message, "f32")) << data_message;
  EXPECT_THROW((void)t.data<int32_t>(), DTypeError);
  EXPECT_NO_THROW((void)t.data<float>());
  // The constructor refuses layouts that leave the storage.
  auto storage = Storage::allocate(24 * sizeof(float), Device::cpu());
  EXPECT_NO_THROW(Tensor(storage, {2, 3, 4}, {12, 4, 1}, 0, DType::f32));
  EXPECT_NO_THROW(Tensor(storage, {2, 3}, {12, 1}, 9, DType::f32));  // reaches element 23 of 24
  EXPECT_THROW(Tensor(storage, {2, 3}, {12, 1}, 10, DType::f32), ValueError);
  EXPECT_THROW(Tensor(storage, {2, 3, 4}, {12, 4, 1}, 1, DType::f32), ValueError);
  EXPECT_THROW(Tensor(storage, {2, 3, 4}, {12, 4, 1}, 0, DType::f64), ValueError);
  EXPECT_THROW(Tensor(storage, {2, 3}, {12, -1}, 5, DType::f32), ValueError);
  EXPECT_THROW(Tensor(storage, {2, 3}, {3, 1}, -1, DType::f32), ValueError);
  EXPECT_THROW(Tensor(storage, {2, 3}, {3}, 0, DType::f32), ShapeError);
  EXPECT_THROW(Tensor(nullptr, {2, 3}, {3, 1}, 0, DType::f32), ValueError);
  EXPECT_NO_THROW(Tensor(storage, {0, 3}, {3, 1}, 1000, DType::f32));  // empty: reaches nothing
}

}  // namespace
}  // namespace microllm
