// Checkpoint layouts a family rewrites. A family whose checkpoint stacks parameters (Phi-3: qkv_proj holds q, k, v;
// gate_up_proj holds gate, up): saved stacked as transformers writes them, loaded back into the same values, and the
// same forward as the Llama block with those weights unstacked. A stacked tensor with the wrong rows is a mismatch
// naming it. Gemma's norm weights, stored as the scale minus 1. transformers' logits for Phi-3 and Gemma 3 folders are
// the golden tests (tools/oracle/model_golden.py, cases phi3 and gemma3).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "microllm/autograd/variable.h"
#include "microllm/io/safetensors.h"
#include "microllm/models/config.h"
#include "microllm/models/loader.h"
#include "test_support.h"

namespace microllm::models {
namespace {

namespace fs = std::filesystem;

nn::TransformerConfig phi3_config() {
  nn::TransformerConfig c;
  c.model_type = "phi3";
  c.vocab_size = 64, c.hidden_size = 32, c.intermediate_size = 40, c.num_layers = 2;
  c.num_heads = 4, c.num_kv_heads = 2, c.max_position_embeddings = 64, c.tie_word_embeddings = false;
  c.rope.theta = 10000;
  c.sliding_window = 6;
  return c;
}

fs::path fresh_dir(const char* what) {
  return fs::temp_directory_path() / (std::string("microllm-") + what + "-" + std::to_string(getpid()) + "-" +
                                      std::to_string(testing::fresh_seed()));
}

Tensor logits_of(const nn::TransformerLM& model, const Tensor& ids) {
  autograd::NoGradGuard no_grad;
  nn::ForwardContext ctx;
  ctx.compute_dtype = DType::f64;
  return model.forward(ids, ctx).value();
}

TEST(StackedWeights, Phi3SavesStackedAndLoadsBackTheSameModel) {
  const nn::TransformerConfig config = phi3_config();
  nn::TransformerLM model(config, testing::fresh_seed());
  const fs::path dir = fresh_dir("phi3");
  save_model(model, dir.string());

  // transformers' names: one qkv_proj [q + 2 kv rows, hidden] and one gate_up_proj [2 x intermediate, hidden].
  const io::SafetensorsCheckpoint checkpoint = io::SafetensorsCheckpoint::open(dir.string());
  EXPECT_TRUE(checkpoint.contains("model.layers.1.self_attn.qkv_proj.weight"));
  EXPECT_FALSE(checkpoint.contains("model.layers.1.self_attn.q_proj.weight"));
  EXPECT_EQ(checkpoint.info("model.layers.0.self_attn.qkv_proj.weight").shape, (Shape{32 + 2 * 16, 32}));
  EXPECT_EQ(checkpoint.info("model.layers.0.mlp.gate_up_proj.weight").shape, (Shape{2 * 40, 32}));
  EXPECT_EQ(read_config_file(dir.string()).window_of(1), 6);

  LoadedModel loaded = load_model(dir.string(), {.dtype = DType::f32, .strict = true});
  EXPECT_TRUE(loaded.report.clean()) << loaded.report.summary();
  for (const nn::ParameterInfo& p : model.named_parameters()) {
    const nn::Variable* back = loaded.model->find_parameter(p.name);
    ASSERT_NE(back, nullptr) << p.name;
    EXPECT_EQ(testing::host_values(back->value()), testing::host_values(p.variable->value())) << p.name;
  }

  // The block is Llama's (with the window): the same weights as a mistral model give the same logits.
  nn::TransformerConfig as_mistral = config;
  as_mistral.model_type = "mistral";
  nn::TransformerLM twin(as_mistral, 0, /*random_init=*/false);
  for (const nn::ParameterInfo& p : twin.named_parameters()) {
    *p.variable = nn::Variable(loaded.model->find_parameter(p.name)->value().clone(), false);
  }
  const Tensor ids = Tensor::from_vector(std::vector<int32_t>{3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3}, {1, 12});
  model.to(DType::f64);
  twin.to(DType::f64);
  EXPECT_EQ(testing::host_values(logits_of(model, ids)), testing::host_values(logits_of(twin, ids)));
  fs::remove_all(dir);
}

TEST(StackedWeights, AStackedTensorWithOtherRowsIsAMismatchNamingIt) {
  nn::TransformerLM model(phi3_config(), testing::fresh_seed());
  const fs::path dir = fresh_dir("phi3-bad");
  save_model(model, dir.string());
  nn::TransformerConfig wider = phi3_config();
  wider.num_kv_heads = 4;  // the checkpoint's qkv_proj has 2 kv heads' rows
  nn::TransformerLM other(wider, 0, /*random_init=*/false);
  try {
    load_weights(other, io::SafetensorsCheckpoint::open(dir.string()), {.dtype = DType::f32, .strict = true});
    ADD_FAILURE() << "a qkv_proj of other rows loaded";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("qkv_proj"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(StackedWeights, Phi3ConfigsReadAsTransformersWritesThem) {
  const std::string json = R"({"model_type": "phi3", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 4096,
    "sliding_window": 2047, "rope_scaling": null, "partial_rotary_factor": 1.0, "resid_pdrop": 0.0})";
  const nn::TransformerConfig c = read_config(json);
  EXPECT_EQ(c.model_type, "phi3");
  EXPECT_EQ(c.window_of(0), 2047);
  EXPECT_EQ(architecture_of("phi3"), "Phi3ForCausalLM");
  std::string partial = json;
  partial.replace(partial.find("\"partial_rotary_factor\": 1.0"), 28, "\"partial_rotary_factor\": 0.75");
  EXPECT_THROW(read_config(partial), NotSupportedError);
  std::string longrope = json;
  longrope.replace(longrope.find("\"rope_scaling\": null"), 20, R"("rope_scaling": {"type": "longrope"})");
  EXPECT_THROW(read_config(longrope), ParseError);  // no original_max_position_embeddings, no factors
}

// Gemma's checkpoints hold each RMSNorm weight as its scale minus 1 (the norm multiplies by 1 + w): the loaded
// modules hold the scale, and a saved folder holds w again.
TEST(NormOffset, Gemma3NormWeightsLoadAsTheirScaleAndSaveAsTransformersStoresThem) {
  nn::TransformerConfig c = phi3_config();
  c.model_type = "gemma3_text";
  c.norm_placement = nn::NormPlacement::sandwich;
  c.qk_norm = true;
  c.mlp_activation = nn::MlpActivation::gelu_tanh;
  c.tie_word_embeddings = true;
  c.embedding_scale = std::sqrt(32.0);
  c.query_pre_attn_scalar = 8;
  nn::TransformerLM model(c, testing::fresh_seed());
  for (const nn::ParameterInfo& p : model.named_parameters()) {  // norm scales away from their initial 1
    if (p.name.ends_with("norm.weight"))
      *p.variable =
          nn::Variable(testing::random_tensor(p.variable->shape(), DType::f32, Device::cpu(), 0.5, 1.5), true);
  }
  const fs::path dir = fresh_dir("gemma3");
  save_model(model, dir.string());
  const io::SafetensorsCheckpoint checkpoint = io::SafetensorsCheckpoint::open(dir.string());
  int norms = 0;
  for (const nn::ParameterInfo& p : model.named_parameters()) {
    const std::vector<double> scale = testing::host_values(p.variable->value());
    std::vector<double> stored = testing::host_values(checkpoint.get(p.name));
    if (p.name.ends_with("norm.weight")) {
      for (double& w : stored) w += 1;
      ++norms;
    }
    for (size_t i = 0; i < scale.size(); ++i) EXPECT_NEAR(stored[i], scale[i], 1e-6) << p.name;
  }
  EXPECT_EQ(norms, 2 * 6 + 1);  // four sandwich norms and QK-norm's two per layer, the final norm
  LoadedModel loaded = load_model(dir.string(), {.dtype = DType::f32, .strict = true});
  EXPECT_TRUE(loaded.report.clean()) << loaded.report.summary();
  EXPECT_EQ(loaded.model->config().model_type, "gemma3_text");
  for (const nn::ParameterInfo& p : model.named_parameters()) {
    const std::vector<double> back = testing::host_values(loaded.model->find_parameter(p.name)->value());
    const std::vector<double> want = testing::host_values(p.variable->value());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(back[i], want[i], 1e-6) << p.name;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace microllm::models
