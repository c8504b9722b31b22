// Loss and every parameter gradient of tiny Llama, Qwen2 (q/k/v biases) and Qwen3 (qk-norm, explicit
// head_dim, untied head) models against PyTorch autograd in f32: golden files written by
// tools/oracle/train_golden.py (weights under Hugging Face names, "ids", "targets", "loss", and
// "grad.<name>" per parameter) next to each model's config.json.
#include <gtest/gtest.h>

#include <filesystem>

#include "microllm/io/atomic_file.h"
#include "microllm/io/safetensors.h"
#include "microllm/train/hf_config.h"
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
  const nn::TransformerConfig config =
      config_from_hf_json(io::read_text_file(config_path.string()), config_path.string());
  EXPECT_EQ(config.model_type, family);
  nn::TransformerLM model(config, 0);
  load_model_weights(model, golden.string());
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

TEST(HfConfig, ReadsTheFamiliesAndRefusesWhatTheModelCannotExpress) {
  const nn::TransformerConfig qwen2 = config_from_hf_json(R"({"model_type": "qwen2", "vocab_size": 100,
      "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true,
      "eos_token_id": [5, 6], "rope_scaling": null})");
  EXPECT_TRUE(qwen2.attention_bias);
  EXPECT_FALSE(qwen2.qk_norm);
  EXPECT_EQ(qwen2.rope.theta, 1e6);
  EXPECT_EQ(qwen2.eos_token_ids, (std::vector<int64_t>{5, 6}));
  const nn::TransformerConfig qwen3 = config_from_hf_json(R"({"model_type": "qwen3", "vocab_size": 100,
      "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 12, "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0}})");
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_EQ(qwen3.head_dim, 12);
  EXPECT_EQ(qwen3.rope.theta, 5000);
  EXPECT_FALSE(qwen3.tie_word_embeddings);
  // Round trip through the exported config.json.
  EXPECT_EQ(hf_config_json(config_from_hf_json(hf_config_json(qwen3))), hf_config_json(qwen3));
  EXPECT_THROW(config_from_hf_json(R"({"model_type": "llama", "vocab_size": 10})"), ParseError);
  EXPECT_THROW(config_from_hf_json(R"({"model_type": "gpt2"})"), NotSupportedError);
  EXPECT_THROW(config_from_hf_json(R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "attention_bias": true})"),
               NotSupportedError);
  EXPECT_THROW(config_from_hf_json("{"), ParseError);
}

}  // namespace
}  // namespace microllm::train
