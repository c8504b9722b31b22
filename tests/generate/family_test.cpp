// A model family defined here, in the test tree, and registered at run time ("test-sandwich": sandwich norms and
// GeGLU, a block no shipped family has): with no line of src/ of its own it reads from a config.json, trains (the
// loss falls; the checkpoint is written and loads back), and generates through the serving engine exactly what
// generate() and the training graph's greedy argmax give. What makes a family is its description
// (nn::TransformerConfig's block fields) and a registry row; the modules and the runner build from it.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "microllm/autograd/variable.h"
#include "microllm/generate/engine.h"
#include "microllm/generate/generate.h"
#include "microllm/io/atomic_file.h"
#include "microllm/models/config.h"
#include "microllm/models/loader.h"
#include "microllm/train/data.h"
#include "microllm/train/trainer.h"
#include "models/config_reader.h"
#include "microllm/ops/reduce.h"
#include "test_support.h"

namespace microllm::generate {
namespace {

namespace fs = std::filesystem;

// The family: the shared Llama-like fields, then its block.
nn::TransformerConfig read_test_sandwich(const models::ConfigReader& r) {
  nn::TransformerConfig c = models::read_common_fields(r, "test-sandwich");
  c.norm_placement = nn::NormPlacement::sandwich;
  r.reject("attention_bias", "the test family has no attention biases");
  return c;
}

void register_test_family() {
  static const bool registered = [] {
    models::register_family({"test-sandwich", "TestSandwichForCausalLM", read_test_sandwich, nullptr});
    return true;
  }();
  (void)registered;
}

std::vector<int32_t> training_graph_greedy(const nn::TransformerLM& model, std::vector<int32_t> ids, int64_t n) {
  autograd::NoGradGuard no_grad;
  nn::ForwardContext ctx;
  ctx.compute_dtype = DType::f64;
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const Tensor logits = model.forward(Tensor::from_vector(ids, {1, static_cast<int64_t>(ids.size())}), ctx).value();
    const auto next = static_cast<int32_t>(argmax(logits.select(1, logits.size(1) - 1), -1).to_vector<int64_t>()[0]);
    out.push_back(next);
    ids.push_back(next);
  }
  return out;
}

TEST(TestOnlyFamily, TrainsAndGeneratesThroughTheEngine) {
  register_test_family();
  const fs::path root = fs::temp_directory_path() / ("microllm-test-family-" + std::to_string(testing::fresh_seed()));
  fs::create_directories(root);
  const nlohmann::json config = {{"model_type", "test-sandwich"}, {"vocab_size", 256},      {"hidden_size", 32},
                                 {"intermediate_size", 48},        {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                                 {"num_key_value_heads", 2},       {"hidden_act", "gelu_pytorch_tanh"},
                                 {"max_position_embeddings", 128}, {"tie_word_embeddings", true},
                                 {"rope_theta", 10000.0},          {"initializer_range", 0.1}};
  io::write_text_atomically((root / "config.json").string(), config.dump());
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog " + std::to_string(i % 7) + "\n";
  io::write_text_atomically((root / "corpus.txt").string(), text);
  train::PrepareOptions prepare;
  prepare.inputs = {(root / "corpus.txt").string()};
  prepare.output = (root / "corpus").string();
  prepare.block_tokens = 512;
  prepare.val_fraction = 0.1;
  train::prepare_token_files(prepare);

  train::TrainConfig c;
  c.model = (root / "config.json").string();
  c.train_data = (root / "corpus.train.bin").string();
  c.val_data = (root / "corpus.val.bin").string();
  c.batch_size = 8, c.seq_len = 32, c.steps = 40, c.lr = 1e-2, c.warmup_steps = 4;
  c.eval_interval = 0, c.eval_batches = 2, c.log_interval = 5;
  c.out_dir = (root / "run").string();
  train::Trainer trainer(c);
  std::vector<double> losses;
  train::TrainCallbacks callbacks;
  callbacks.on_log = [&](const train::StepMetrics& m) { losses.push_back(m.loss); };
  const train::TrainResult result = trainer.run(callbacks);
  ASSERT_GE(losses.size(), 2u);
  EXPECT_LT(losses.back(), losses.front() - 0.5) << "the test family does not learn";

  // The checkpoint is a directory of this family: its config names it, its weights the four norms of a block.
  const std::string checkpoint = result.checkpoint_dir;
  EXPECT_EQ(models::read_config_file(checkpoint).norm_placement, nn::NormPlacement::sandwich);
  models::LoadedModel loaded = models::load_model(checkpoint, {.dtype = DType::f64});
  nn::TransformerLM& model = *loaded.model;
  ASSERT_NE(model.find_parameter("model.layers.1.pre_feedforward_layernorm.weight"), nullptr);

  const std::vector<int32_t> prompt = {116, 104, 101, 32, 113};  // "the q"
  const int64_t n = 12;
  const std::vector<int32_t> reference = training_graph_greedy(model, prompt, n);
  GenerateOptions options;
  options.max_new_tokens = n;
  options.sampling.temperature = 0;
  options.compute_dtype = DType::f64;
  EXPECT_EQ(generate(model, prompt, options), reference);
  model.fuse_projections();
  Engine engine(model, {.max_batch = 2, .prefill_chunk = 4, .dtype = DType::f64});
  std::vector<int32_t> served;
  EngineRequest request;
  request.prompt = prompt;
  request.max_new_tokens = n;
  request.sampling.temperature = 0;
  request.on_finish = [&](const Generation& g) { served = g.tokens; };
  engine.submit(request);
  engine.run_until_idle();
  EXPECT_EQ(served, reference);
  fs::remove_all(root);
}

}  // namespace
}  // namespace microllm::generate
