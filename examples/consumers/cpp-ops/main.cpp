// Uses the installed SDK: tensors, a seeded generator, and a few ops; checks one result by hand.
#include <microllm/microllm.h>

#include <cmath>
#include <cstdio>

int main() {
  using namespace microllm;
  Generator gen(42);
  const Tensor x = Tensor::randn({2, 3, 8}, gen);
  const Tensor w = Tensor::ones({8});
  const Tensor y = rms_norm(x, w, 1e-6);

  // Every row of y has mean square 1 (up to eps) when the weight is one.
  const std::vector<float> v = y.to_vector<float>();
  for (int row = 0; row < 6; ++row) {
    double ms = 0;
    for (int i = 0; i < 8; ++i) ms += v[row * 8 + i] * v[row * 8 + i];
    ms /= 8;
    if (std::abs(ms - 1.0) > 1e-4) {
      std::fprintf(stderr, "row %d: mean square %f, expected 1\n", row, ms);
      return 1;
    }
  }
  const Tensor p = softmax(matmul(x, x, false, true));
  std::printf("microLLM %s: rms_norm ok, softmax(x x^T) shape %s\n", MICROLLM_VERSION_STRING, p.shape().str().c_str());
  return 0;
}
