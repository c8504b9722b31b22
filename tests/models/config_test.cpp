// config.json for every family: the published configs give the published parameter counts, exported
// configs read back the same, and what the runtime cannot run is refused naming the field.
#include "microllm/models/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "microllm/core/error.h"

namespace microllm::models {
namespace {

namespace fs = std::filesystem;
const fs::path kConfigs = fs::path(MICROLLM_SOURCE_DIR) / "tests/fixtures/configs";

TEST(ModelConfig, PublishedConfigsGiveThePublishedParameterCounts) {
  const struct {
    const char* file;
    const char* model_type;
    int64_t parameters;  // from the model cards / tests/fixtures/configs/README.md
  } cases[] = {
      {"qwen2.5-0.5b.json", "qwen2", 494032768},       {"deepseek-r1-distill-qwen-1.5b.json", "qwen2", 1777088000},
      {"qwen3-0.6b.json", "qwen3", 596049920},         {"smollm2-135m.json", "llama", 134515008},
      {"gemma-3-270m.json", "gemma3_text", 268098176}, {"gemma-3-1b.json", "gemma3_text", 999885952},
      {"phi-3-mini-4k-instruct.json", "phi3", 3821079552}};
  for (const auto& c : cases) {
    const nn::TransformerConfig config = read_config_file((kConfigs / c.file).string());
    EXPECT_EQ(config.model_type, c.model_type) << c.file;
    EXPECT_EQ(config.num_parameters(), c.parameters) << c.file;
    // The exported config reads back to the same model.
    EXPECT_EQ(write_config(read_config(write_config(config))), write_config(config)) << c.file;
  }
  const nn::TransformerConfig qwen3 = read_config_file((kConfigs / "qwen3-0.6b.json").string());
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_EQ(qwen3.resolved_head_dim(), 128);
  const nn::TransformerConfig qwen25 = read_config_file((kConfigs / "qwen2.5-0.5b.json").string());
  EXPECT_TRUE(qwen25.attention_bias);
  EXPECT_TRUE(qwen25.tie_word_embeddings);
  EXPECT_EQ(qwen25.rope.theta, 1e6);
}

std::string config_with(const std::string& model_type, const std::string& extra) {
  return R"({"model_type": ")" + model_type + R"(", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2)" +
         extra + "}";
}

void expect_refused(const std::string& json, const std::string& field) {
  try {
    read_config(json, "test/config.json");
    ADD_FAILURE() << "accepted " << json;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test/config.json"), std::string::npos) << e.what();
  }
}

// Sliding windows as transformers reads them: Mistral's on every layer, Qwen's from max_window_layers on, layer_types
// where given; a window as long as the context hides nothing. Written configs read back to the same windows.
TEST(ModelConfig, SlidingWindowsReadAsTransformersReadsThem) {
  const std::string context = R"(, "max_position_embeddings": 32768)";
  const nn::TransformerConfig mistral = read_config(config_with("mistral", context + R"(, "sliding_window": 4096)"));
  EXPECT_EQ(mistral.window_of(0), 4096);
  EXPECT_EQ(mistral.window_of(1), 4096);
  EXPECT_EQ(read_config(config_with("mistral", context + R"(, "sliding_window": 32768)")).window_of(0), 0);
  EXPECT_EQ(read_config(config_with("mistral", context)).window_of(0), 0);

  const nn::TransformerConfig qwen = read_config(
      config_with("qwen2", context + R"(, "use_sliding_window": true, "sliding_window": 64, "max_window_layers": 1)"));
  EXPECT_EQ(qwen.window_of(0), 0);
  EXPECT_EQ(qwen.window_of(1), 64);
  EXPECT_EQ(
      read_config(config_with("qwen3", context + R"(, "use_sliding_window": true, "sliding_window": 64)")).window_of(1),
      0);  // max_window_layers defaults to 28: both layers full

  const nn::TransformerConfig typed = read_config(config_with(
      "mistral", context + R"(, "sliding_window": 8, "layer_types": ["full_attention", "sliding_attention"])"));
  EXPECT_EQ(typed.window_of(0), 0);
  EXPECT_EQ(typed.window_of(1), 8);

  for (const nn::TransformerConfig& c : {mistral, qwen, typed}) {
    const nn::TransformerConfig back = read_config(write_config(c));
    for (int64_t layer = 0; layer < c.num_layers; ++layer) EXPECT_EQ(back.window_of(layer), c.window_of(layer));
  }
  nn::TransformerConfig llama = read_config(config_with("llama", context));
  llama.sliding_window = 16;  // a llama config.json has no field for it
  EXPECT_THROW(write_config(llama), NotSupportedError);
}

TEST(ModelConfig, RefusesWhatItCannotRunNamingTheField) {
  expect_refused(config_with("gpt2", ""), "model_type");
  EXPECT_NO_THROW(read_config(config_with("mistral", R"(, "sliding_window": null)")));
  expect_refused(config_with("qwen2", R"(, "use_sliding_window": true)"), "sliding_window");
  expect_refused(config_with("mistral", R"(, "sliding_window": 0)"), "sliding_window");
  expect_refused(config_with("mistral", R"(, "sliding_window": 8, "layer_types": ["sliding_attention"])"),
                 "layer_types");
  expect_refused(
      config_with("mistral", R"(, "sliding_window": 8, "layer_types": ["chunked_attention", "full_attention"])"),
      "chunked_attention");
  EXPECT_NO_THROW(read_config(config_with("qwen2", R"(, "use_sliding_window": false, "sliding_window": 4096)")));
  expect_refused(config_with("qwen2", R"(, "num_experts": 8)"), "num_experts");
  expect_refused(config_with("llama", R"(, "rope_scaling": {"rope_type": "mrope", "factor": 4})"), "rope_type");
  expect_refused(config_with("qwen2", R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4, "mscale": 0.7})"),
                 "mscale");
  expect_refused(config_with("phi3", R"(, "rope_scaling": {"rope_type": "longrope", "short_factor": [1, 1, 1, 1]})"),
                 "original_max_position_embeddings");
  expect_refused(config_with("gemma3_text", R"(, "attn_logit_softcapping": 50.0)"), "attn_logit_softcapping");
  expect_refused(config_with("gemma3_text", R"(, "hidden_activation": "silu")"), "hidden_activation");
  expect_refused(config_with("gemma3_text", R"(, "use_bidirectional_attention": true)"), "use_bidirectional_attention");
  expect_refused(config_with("llama", R"(, "hidden_act": "gelu")"), "hidden_act");
  expect_refused(config_with("llama", R"(, "attention_bias": true)"), "attention_bias");
  expect_refused(config_with("qwen3", R"(, "mlp_bias": true)"), "mlp_bias");
  expect_refused(R"({"model_type": "llama", "vocab_size": 10})", "hidden_size");
  expect_refused(config_with("llama", R"(, "num_key_value_heads": 3)"), "num_key_value_heads");
  expect_refused(config_with("llama", R"(, "vocab_size": "many")"), "vocab_size");
  expect_refused("{", "JSON");
  const nn::TransformerConfig llama31 = read_config(
      config_with("llama", R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, "eos_token_id": [1, 2])"));
  EXPECT_EQ(llama31.rope.scaling.type, RopeScalingType::llama3);
  EXPECT_EQ(llama31.eos_token_ids, (std::vector<int64_t>{1, 2}));
  const nn::TransformerConfig transformers5 = read_config(
      config_with("qwen3", R"(, "head_dim": 12, "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0})"));
  EXPECT_EQ(transformers5.rope.theta, 5000);
  EXPECT_EQ(transformers5.head_dim, 12);
}

// Gemma 3 as transformers reads the Hub's configs: every sixth layer global (sliding_window_pattern, or
// layer_types), the sliding layers on rope_local_base_freq, head_dim 256 by default, scores scaled by
// query_pre_attn_scalar, embeddings by sqrt(hidden_size); and transformers 5's rope_parameters per layer type.
TEST(ModelConfig, Gemma3ReadsAsTransformersReadsIt) {
  for (const char* file : {"gemma-3-270m.json", "gemma-3-1b.json"}) {
    const nn::TransformerConfig c = read_config_file((kConfigs / file).string());
    SCOPED_TRACE(file);
    EXPECT_EQ(c.norm_placement, nn::NormPlacement::sandwich);
    EXPECT_TRUE(c.qk_norm);
    EXPECT_EQ(c.mlp_activation, nn::MlpActivation::gelu_tanh);
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_EQ(c.resolved_head_dim(), 256);
    EXPECT_DOUBLE_EQ(c.embedding_scale, std::sqrt(static_cast<double>(c.hidden_size)));
    EXPECT_DOUBLE_EQ(c.attention(0).scale, 1.0 / 16);
    for (int64_t layer = 0; layer < c.num_layers; ++layer) {
      const bool global = (layer + 1) % 6 == 0;
      EXPECT_EQ(c.window_of(layer), global ? 0 : 512) << layer;
      EXPECT_EQ(c.attention(layer).rope.theta, global ? 1e6 : 1e4) << layer;
    }
  }
  const nn::TransformerConfig v5 = read_config(config_with("gemma3_text", R"(, "head_dim": 8,
      "query_pre_attn_scalar": 32, "sliding_window": 16, "final_logit_softcapping": 30.0,
      "layer_types": ["sliding_attention", "full_attention"],
      "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})"));
  EXPECT_EQ(v5.attention(0).rope.theta, 1e4);
  EXPECT_EQ(v5.attention(0).rope.scaling.type, RopeScalingType::none);
  EXPECT_EQ(v5.attention(1).rope.theta, 1e6);
  EXPECT_EQ(v5.attention(1).rope.scaling.type, RopeScalingType::linear);
  EXPECT_DOUBLE_EQ(v5.attention(1).scale, 1 / std::sqrt(32.0));
  EXPECT_EQ(v5.final_logit_softcap, 30.0);
  const nn::TransformerConfig back = read_config(write_config(v5));
  EXPECT_EQ(back.final_logit_softcap, 30.0);
  EXPECT_EQ(back.query_pre_attn_scalar, 32);
  for (int64_t layer = 0; layer < 2; ++layer) {
    EXPECT_EQ(back.window_of(layer), v5.window_of(layer));
    EXPECT_EQ(back.attention(layer).rope.theta, v5.attention(layer).rope.theta);
  }
}

// yarn and longrope: their frequencies and attention factor as transformers computes them (tests/ops/rope_test.cpp
// checks the frequencies); longrope runs the short factors, so the context stops at the original length.
TEST(ModelConfig, YarnAndLongropeScalingRead) {
  const nn::TransformerConfig yarn = read_config(config_with("qwen2", R"(, "max_position_embeddings": 131072,
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})"));
  EXPECT_EQ(yarn.rope.scaling.type, RopeScalingType::yarn);
  EXPECT_EQ(yarn.rope.scaling.original_max_position_embeddings, 32768);
  const double m = 0.1 * std::log(4.0) + 1;
  EXPECT_NEAR(yarn.attention(0).scale, m * m / std::sqrt(8.0), 1e-12);
  EXPECT_EQ(yarn.context_limit(), 131072);
  const nn::TransformerConfig longrope = read_config(config_with("phi3", R"(, "max_position_embeddings": 131072,
      "original_max_position_embeddings": 4096, "rope_scaling": {"type": "longrope",
      "short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0, 3.0, 4.0, 5.0]})"));
  EXPECT_EQ(longrope.rope.scaling.type, RopeScalingType::longrope);
  EXPECT_EQ(longrope.rope.scaling.frequency_factors, (std::vector<double>{1.0, 1.5, 2.0, 3.0}));
  EXPECT_EQ(longrope.context_limit(), 4096);
  const double f = std::sqrt(1 + std::log(32.0) / std::log(4096.0));
  EXPECT_NEAR(longrope.attention(0).scale, f * f / std::sqrt(8.0), 1e-12);
  // dynamic: the default frequencies up to the original length (transformers stretches them past it only).
  const nn::TransformerConfig dynamic = read_config(config_with("llama", R"(, "max_position_embeddings": 8192,
      "rope_scaling": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4096})"));
  EXPECT_EQ(dynamic.rope.scaling.type, RopeScalingType::dynamic);
  EXPECT_EQ(dynamic.context_limit(), 4096);
  EXPECT_DOUBLE_EQ(dynamic.attention(0).scale, 1 / std::sqrt(8.0));
  EXPECT_EQ(read_config(config_with("phi3", R"(, "max_position_embeddings": 8192, "rope_scaling": {"type": "su",
      "short_factor": [1, 1, 1, 1], "long_factor": [2, 2, 2, 2], "original_max_position_embeddings": 4096})"))
                .rope.scaling.type,
            RopeScalingType::longrope);
  for (const nn::TransformerConfig& c : {yarn, longrope, dynamic}) {
    EXPECT_EQ(write_config(read_config(write_config(c))), write_config(c));
    EXPECT_DOUBLE_EQ(read_config(write_config(c)).attention(0).scale, c.attention(0).scale);
  }
}

// Regression (found while writing fuzz/model_config_fuzz.cpp): integers above INT64_MAX, which the JSON parser
// stores as unsigned, were cast to int64_t and read as negative numbers (18446744073709551615 became -1, so
// max_position_embeddings -1 or eos_token_id -1 were accepted). They are refused, naming the field.
TEST(ModelConfig, RefusesIntegersAboveInt64Max) {
  const std::string huge = "18446744073709551615";
  expect_refused(config_with("llama", ", \"max_position_embeddings\": " + huge), "max_position_embeddings");
  expect_refused(config_with("llama", ", \"vocab_size\": " + huge), "out of range");
  expect_refused(config_with("llama", ", \"eos_token_id\": " + huge), "eos_token_id");
  expect_refused(config_with("llama", ", \"eos_token_id\": [2, " + huge + "]"), "eos_token_id");
  expect_refused(config_with("llama", ", \"bos_token_id\": " + huge), "bos_token_id");
  expect_refused(config_with("llama", R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
      "original_max_position_embeddings": 9223372036854775808})"),
                 "original_max_position_embeddings");
  // INT64_MAX itself is a valid integer.
  EXPECT_EQ(read_config(config_with("llama", ", \"eos_token_id\": 9223372036854775807")).eos_token_ids,
            (std::vector<int64_t>{INT64_MAX}));
}

TEST(GenerationConfig, StopIdsAndSamplingDefaultsComeFromGenerationConfigJson) {
  const fs::path dir = fs::temp_directory_path() / ("microllm-generation-config-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  nn::TransformerConfig config;
  config.eos_token_ids = {3};
  // No file: no generation config; the stop ids are config.json's and the extra ones.
  EXPECT_FALSE(read_generation_config(dir.string()).has_value());
  const int32_t extra[] = {9, 3};
  EXPECT_EQ(stop_token_ids(dir.string(), config, extra), (std::vector<int64_t>{3, 9}));

  std::ofstream(dir / "generation_config.json")
      << R"({"eos_token_id": [5, 3], "do_sample": false, "top_k": 20, "top_p": 0.8, "temperature": "hot"})";
  const std::optional<GenerationConfig> g = read_generation_config(dir.string());
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->eos_token_ids, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(g->do_sample, false);
  EXPECT_EQ(g->top_k, 20.0);
  EXPECT_EQ(g->top_p, 0.8);
  EXPECT_FALSE(g->temperature.has_value());  // not a number: ignored, as transformers ignores it
  EXPECT_FALSE(g->min_p.has_value());
  const int32_t eos_and_end_of_turn[] = {7, 5};
  EXPECT_EQ(stop_token_ids(dir.string(), config, eos_and_end_of_turn), (std::vector<int64_t>{3, 5, 7}));

  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [5, )";
  try {
    read_generation_config(dir.string());
    ADD_FAILURE() << "a truncated generation_config.json was accepted";
  } catch (const ParseError& e) {
    EXPECT_NE(std::string(e.what()).find("generation_config.json"), std::string::npos) << e.what();
  }
  // A number past a double's range is the JSON library's out_of_range, not its parse_error: a ParseError too.
  std::ofstream(dir / "generation_config.json") << R"({"temperature": 1e309})";
  EXPECT_THROW(read_generation_config(dir.string()), ParseError);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace microllm::models
