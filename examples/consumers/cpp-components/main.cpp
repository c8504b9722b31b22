// Links microLLM::core alone: tensors, views and dtype conversion, no operators.
#include <microllm/core/tensor.h>

#include <cstdio>

int main() {
  using microllm::DType;
  using microllm::Tensor;
  const Tensor t = Tensor::arange(12, DType::f32).view({3, 4});
  const Tensor column = t.select(1, 2);                      // [2, 6, 10], a strided view
  const std::vector<float> values = column.to(DType::bf16).to_vector<float>();
  if (values != std::vector<float>{2, 6, 10}) {
    std::fprintf(stderr, "unexpected column values\n");
    return 1;
  }
  std::printf("core component ok: %s\n", column.str().c_str());
  return 0;
}
