// Loss and every parameter gradient of tiny Llama, Qwen2 (q/k/v biases) and Qwen3 (qk-norm, explicit
// head_dim, untied head) models against PyTorch autograd in f32: golden files written by
// tools/oracle/train_golden.py (weights under Hugging Face names, "ids", "targets", "loss", and
// "grad.<name>" per parameter) next to each model's config.json.
#include <gtest/gtest.h>

#include <filesystem>

#include "microllm/io/atomic_file.h"
#include "microllm/io/safetensors.h"
#include "microllm/models/config.h"
#include "microllm/models/loader.h"
#include "test_support.h"

namespace microllm::train {
namespace {

namespace fs = std::filesystem;

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, LossAndGradientsMatchPyTorch) {
  const std::string family = GetParam();
  const fs::path dir = fs::path(MICROLLM_SOURCE_DIR) / "tests/fixtures/train";
  const fs::path golden = dir / ("golden_" + family + ".safetensors");
  const fs::path config_path = dir / ("golden_" + family + ".config.json");
  if (!fs::exists(golden) || !fs::exists(config_path)) {
    GTEST_SKIP() << golden.string() << " or its config is missing: run tools/oracle/train_golden.py where torch "
                 << "and transformers are installed (the GPU machine) and commit tests/fixtures/train/";
  }
  const nn::TransformerConfig config = models::read_config_file(config_path.string());
  EXPECT_EQ(config.model_type, family);
  nn::TransformerLM model(config, 0);
  // The golden file also holds the batch, the loss and the gradients: every parameter must be there,
  // the other tensors are the extras a non-strict load reports as unexpected.
  const models::LoadReport report =
      models::load_weights(model, io::SafetensorsCheckpoint::open(golden.string()), {Device::cpu(), DType::f32, false});
  ASSERT_TRUE(report.missing.empty()) << report.summary();
  ASSERT_TRUE(report.mismatched.empty()) << report.summary();
  const io::SafetensorsFile file = io::SafetensorsFile::open(golden.string());
  const Tensor ids = file.get("ids").to(DType::i64), targets = file.get("targets").to(DType::i64);
  const autograd::Variable loss = model.loss(ids, targets, nn::ForwardContext{});
  EXPECT_NEAR(loss.value().item<double>(), file.get("loss").item<double>(), 1e-5);
  loss.backward();
  int checked = 0;
  for (const auto& p : model.named_parameters()) {
    ASSERT_TRUE(file.contains("grad." + p.name)) << "golden file lacks grad." << p.name;
    ASSERT_TRUE(p.variable->grad().defined()) << p.name << " got no gradient";
    EXPECT_LE(testing::relative_error(p.variable->grad(), file.get("grad." + p.name)), 1e-4) << p.name;
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

INSTANTIATE_TEST_SUITE_P(Families, GoldenTest, ::testing::Values("llama", "qwen2", "qwen3"),
                         [](const ::testing::TestParamInfo<std::string>& param) { return param.param; });

}  // namespace
}  // namespace microllm::train
