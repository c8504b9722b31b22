// The trainer, on every device: exact resume (N steps straight == k steps + SIGINT checkpoint + resume +
// N - k steps, byte for byte), gradient accumulation (2 micro-batches of B == 1 batch of 2B), the
// checkpoint's files (Hugging Face names and config, optimizer state, trainer state), the config JSON,
// metrics/loss-curve outputs, and what a run does with a checkpoint already there (resume, overwrite or
// refuse).
#include "microllm/train/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "../tokenizer/tokenizer_test_util.h"
#include "microllm/io/atomic_file.h"
#include "microllm/io/safetensors.h"
#include "microllm/train/checkpoint.h"
#include "microllm/models/loader.h"
#include "test_support.h"

namespace microllm::train {
namespace {

namespace fs = std::filesystem;

class TrainerTest : public testing::DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;  // no corpus to write for a device this machine lacks
    std::string name = "microllm_trainer_test_" + std::to_string(::getpid()) + "_" +
                       ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');  // parameterized names hold a '/'
    root_ = (fs::temp_directory_path() / name).string();
    fs::remove_all(root_);
    fs::create_directories(root_);
    std::string text;
    for (int i = 0; i < 300; ++i)
      text += "And God said, Let there be light: and there was light. " + std::to_string(i) + "\n";
    io::write_text_atomically(root_ + "/corpus.txt", text);
    PrepareOptions options;
    options.inputs = {root_ + "/corpus.txt"};
    options.output = root_ + "/corpus";
    options.block_tokens = 1024;
    options.val_fraction = 0.1;
    prepare_token_files(options);
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }

  TrainConfig config(const std::string& name) const {
    TrainConfig c;
    c.model = "tiny";
    c.train_data = root_ + "/corpus.train.bin";
    c.val_data = root_ + "/corpus.val.bin";
    c.batch_size = 4;
    c.seq_len = 32;
    c.steps = 6;
    c.lr = 3e-3;
    c.warmup_steps = 2;
    c.eval_interval = 2;
    c.eval_batches = 2;
    c.log_interval = 2;
    c.out_dir = root_ + "/" + name;
    c.device = GetParam().str();
    c.seed = 5;
    return c;
  }

  std::string root_;
};

std::vector<std::vector<uint8_t>> weight_bytes(nn::TransformerLM& model) {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& p : model.named_parameters()) {
    const Tensor host = p.variable->value().to(Device::cpu()).contiguous();
    const auto* bytes = static_cast<const uint8_t*>(host.data_ptr());
    out.emplace_back(bytes, bytes + host.nbytes());
  }
  return out;
}

TEST_P(TrainerTest, ResumeAfterSigintIsExact) {
  for (const char* optimizer_dtype : {"f32", "bf16"}) {
    SCOPED_TRACE(optimizer_dtype);
    TrainConfig straight_config = config(std::string("straight_") + optimizer_dtype);
    straight_config.optimizer_dtype = optimizer_dtype;
    Trainer straight(straight_config);
    const TrainResult full = straight.run();
    EXPECT_EQ(full.steps, 6);
    EXPECT_FALSE(full.interrupted);

    TrainConfig split_config = config(std::string("split_") + optimizer_dtype);
    split_config.optimizer_dtype = optimizer_dtype;
    split_config.checkpoint_interval = 2;
    TrainResult first;
    {
      Trainer trainer(split_config);
      TrainCallbacks callbacks;
      callbacks.on_step = [](int64_t step) {
        if (step == 3) std::raise(SIGINT);  // what Ctrl-C does; the handler only sets a flag
      };
      first = trainer.run(callbacks);
    }
    EXPECT_TRUE(first.interrupted);
    EXPECT_EQ(first.steps, 3);
    const std::string dir = split_config.resolved_checkpoint_dir();
    for (const char* file : {"model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json"}) {
      EXPECT_TRUE(fs::exists(fs::path(dir) / file)) << file;
    }
    split_config.resume = true;
    Trainer resumed(split_config);
    EXPECT_TRUE(resumed.resumed());
    EXPECT_EQ(resumed.step(), 3);
    const TrainResult rest = resumed.run();
    EXPECT_EQ(rest.steps, 6);
    EXPECT_EQ(weight_bytes(resumed.model()), weight_bytes(straight.model())) << "resumed weights differ";
    ASSERT_TRUE(rest.last_eval && full.last_eval);
    EXPECT_EQ(rest.last_eval->loss, full.last_eval->loss);
    // A finished run resumed again does nothing, and names the checkpoint that holds its final state.
    Trainer done(split_config);
    const TrainResult again = done.run();
    EXPECT_EQ(again.steps, 6);
    EXPECT_EQ(again.checkpoint_dir, dir);
  }
}

// bf16-mixed with head_dim 64: on CUDA this takes the flash-attention kernels (the tiny preset's head_dim
// 32 takes the reference ones), so this is the resume a model-s run on the GPU depends on.
TEST_P(TrainerTest, ResumeIsExactInBf16MixedWithHeadDim64) {
  io::write_text_atomically(root_ + "/config.json", R"({"model_type": "llama", "vocab_size": 256,
      "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
      "num_key_value_heads": 1, "tie_word_embeddings": true})");
  auto make = [&](const std::string& name) {
    TrainConfig c = config(name);
    c.model = root_ + "/config.json";
    c.precision = "bf16-mixed";
    c.steps = 4;
    c.seq_len = 64;
    return c;
  };
  Trainer straight(make("bf16_straight"));
  straight.run();
  TrainConfig split = make("bf16_split");
  {
    Trainer first(split);
    TrainCallbacks callbacks;
    callbacks.on_step = [](int64_t step) {
      if (step == 2) std::raise(SIGINT);
    };
    EXPECT_TRUE(first.run(callbacks).interrupted);
  }
  split.resume = true;
  Trainer resumed(split);
  EXPECT_EQ(resumed.step(), 2);
  resumed.run();
  EXPECT_EQ(weight_bytes(resumed.model()), weight_bytes(straight.model())) << "resumed weights differ";
}

TEST_P(TrainerTest, TwoMicroBatchesEqualOneDoubleBatch) {
  // The sampler draws window starts one after another, so 2 x B windows equal 2B windows.
  TrainConfig a = config("accumulated"), b = config("double");
  a.grad_accum = 2;
  b.batch_size = 8;
  a.steps = b.steps = 3;
  Trainer ta(a), tb(b);
  ta.run();
  tb.run();
  auto pa = ta.model().named_parameters(), pb = tb.model().named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_LE(testing::relative_error(pa[i].variable->value(), pb[i].variable->value()), 1e-5) << pa[i].name;
  }
  // And differ from one step of a single micro-batch.
  TrainConfig c = config("single");
  c.steps = 3;
  Trainer tc(c);
  tc.run();
  EXPECT_GT(testing::relative_error(tc.model().named_parameters()[0].variable->value(), pb[0].variable->value()), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Devices, TrainerTest, ::testing::ValuesIn(testing::test_devices()), testing::device_test_name);

class TrainerFilesTest : public TrainerTest {};

TEST_P(TrainerFilesTest, CheckpointHoldsHuggingFaceFilesStateAndMetrics) {
  TrainConfig c = config("files");
  c.model_type = "qwen3";
  c.precision = "bf16-mixed";
  c.steps = 4;
  Trainer trainer(c);
  std::vector<double> losses;
  TrainCallbacks callbacks;
  callbacks.on_log = [&](const StepMetrics& m) { losses.push_back(m.loss); };
  const TrainResult r = trainer.run(callbacks);
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_LT(losses.back(), std::log(256.0) + 0.1);
  const std::string dir = c.resolved_checkpoint_dir();
  const io::SafetensorsFile model = io::SafetensorsFile::open(dir + "/model.safetensors");
  EXPECT_EQ(model.metadata().at("format"), "pt");
  EXPECT_TRUE(model.contains("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_TRUE(model.contains("lm_head.weight") == !trainer.model().config().tie_word_embeddings);
  EXPECT_EQ(model.info("model.embed_tokens.weight").dtype, DType::f32);
  const nlohmann::json hf = nlohmann::json::parse(io::read_text_file(dir + "/config.json"));
  EXPECT_EQ(hf["model_type"], "qwen3");
  EXPECT_EQ(hf["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(hf["num_hidden_layers"], 5);
  EXPECT_EQ(hf["head_dim"], 32);
  const io::SafetensorsFile opt = io::SafetensorsFile::open(dir + "/optimizer.safetensors");
  EXPECT_TRUE(opt.contains("exp_avg.model.embed_tokens.weight"));
  EXPECT_TRUE(opt.contains("exp_avg_sq.model.norm.weight"));
  EXPECT_EQ(opt.get("step").item<int64_t>(), 4);
  const nlohmann::json state = nlohmann::json::parse(io::read_text_file(dir + "/trainer_state.json"));
  EXPECT_EQ(state["step"], 4);
  EXPECT_EQ(state["config"]["precision"], "bf16-mixed");
  EXPECT_EQ(state["data"]["batches_drawn"], 4);
  EXPECT_EQ(state["metrics"]["eval"].size(), 2u);
  EXPECT_EQ(state["schedule"]["decay"], "cosine");
  EXPECT_TRUE(state["generators"]["sampler"].contains("offset"));
  // metrics.jsonl: one line per log and per evaluation; the loss curve is an SVG.
  const std::string metrics = io::read_text_file(c.out_dir + "/metrics.jsonl");
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 4);
  EXPECT_NE(io::read_text_file(c.out_dir + "/loss.svg").find("<polyline"), std::string::npos);
  // The checkpoint loads back as a model with the same weights.
  auto loaded = models::load_model(dir).model;
  EXPECT_EQ(weight_bytes(*loaded), [&] {
    trainer.model().to(Device::cpu());
    return weight_bytes(trainer.model());
  }());
  ASSERT_TRUE(r.last_eval);
  EXPECT_NEAR(r.last_eval->nats_per_byte, r.last_eval->loss, 1e-12);  // bytes: one token a byte
}

TEST_P(TrainerFilesTest, KeepBestSavesTheCheckpointOfTheLowestValidationLoss) {
  TrainConfig c = config("best");
  c.keep_best = true;
  c.steps = 8;
  c.eval_interval = 1;
  c.lr = 3e-2;  // large steps: the validation loss goes down and up, so not every evaluation improves
  Trainer trainer(c);
  std::vector<EvalMetrics> evals;
  std::vector<int64_t> best_saves;
  TrainCallbacks callbacks;
  callbacks.on_eval = [&](const EvalMetrics& m) { evals.push_back(m); };
  callbacks.on_checkpoint = [&](const std::string& dir) {
    if (dir == c.best_checkpoint_dir()) best_saves.push_back(trainer.step());
  };
  trainer.run(callbacks);
  ASSERT_EQ(evals.size(), 8u);
  std::vector<int64_t> improvements;
  double best = INFINITY;
  for (const EvalMetrics& m : evals) {
    if (m.loss < best) improvements.push_back(m.step);
    best = std::min(best, m.loss);
  }
  EXPECT_EQ(best_saves, improvements);
  const nlohmann::json state =
      nlohmann::json::parse(io::read_text_file(c.best_checkpoint_dir() + "/trainer_state.json"));
  EXPECT_EQ(state["step"], improvements.back());
  EXPECT_TRUE(fs::exists(c.best_checkpoint_dir() + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(c.resolved_checkpoint_dir() + "/model.safetensors"));  // the last one as before
}

TEST_P(TrainerFilesTest, ConfigJsonRoundTripsAndRejectsUnknownFields) {
  TrainConfig c = config("json");
  c.optimizer = "sgd";
  c.clip = 0.5;
  const TrainConfig back = TrainConfig::from_json(c.to_json());
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_THROW(TrainConfig::from_json(R"({"stpes": 10})"), ParseError);
  EXPECT_THROW(TrainConfig::from_json(R"({"steps": "ten"})"), ParseError);
  EXPECT_THROW(TrainConfig::from_json(R"({"lr": 1e309})"), ParseError);  // the JSON library's out_of_range
  const TrainConfig data = TrainConfig::from_json(R"({"data": "runs/kjv.bin", "steps": 7})");
  EXPECT_EQ(data.train_data, "runs/kjv.train.bin");
  EXPECT_EQ(data.val_data, "runs/kjv.val.bin");
  EXPECT_EQ(data.steps, 7);
  TrainConfig bad = c;
  bad.precision = "fp8";
  EXPECT_THROW(bad.validate(), ValueError);
}

TEST_P(TrainerFilesTest, AtomicDirectoryWriteKeepsTheOldCheckpointWhenTheNewOneFails) {
  const std::string dir = root_ + "/ckpt";
  write_directory_atomically(dir, [](const std::string& tmp) { io::write_text_atomically(tmp + "/a.txt", "one"); });
  EXPECT_EQ(io::read_text_file(dir + "/a.txt"), "one");
  EXPECT_THROW(write_directory_atomically(dir,
                                          [](const std::string& tmp) {
                                            io::write_text_atomically(tmp + "/a.txt", "two");
                                            throw IoError("test", "disk full");
                                          }),
               IoError);
  EXPECT_EQ(io::read_text_file(dir + "/a.txt"), "one");
  write_directory_atomically(dir, [](const std::string& tmp) { io::write_text_atomically(tmp + "/b.txt", "three"); });
  EXPECT_FALSE(fs::exists(dir + "/a.txt"));
  EXPECT_EQ(io::read_text_file(dir + "/b.txt"), "three");
  write_directory_atomically(dir + "/", [](const std::string& tmp) { io::write_text_atomically(tmp + "/c.txt", "4"); });
  EXPECT_EQ(io::read_text_file(dir + "/c.txt"), "4");
  for (const auto& entry : fs::directory_iterator(root_)) {
    EXPECT_EQ(entry.path().filename().string().find("ckpt.tmp"), std::string::npos) << "leftover " << entry.path();
  }
}

TEST_P(TrainerFilesTest, ABpeTokenizerFromPrepareLandsInTheCheckpoint) {
  io::write_text_atomically(root_ + "/tokenizer.json", testing::byte_level_json({{"t", "h"}, {"th", "e"}}).dump());
  PrepareOptions options;
  options.inputs = {root_ + "/corpus.txt"};
  options.output = root_ + "/bpe";
  options.tokenizer_path = root_ + "/tokenizer.json";
  options.block_tokens = 512;
  options.val_fraction = 0.1;
  const PrepareResult prepared = prepare_token_files(options);
  EXPECT_EQ(prepared.tokenizer_copy, root_ + "/bpe.tokenizer.json");
  TrainConfig c = config("bpe");
  c.train_data = prepared.train_path;
  c.val_data = prepared.val_path;
  c.steps = 2;
  Trainer trainer(c);
  EXPECT_EQ(trainer.model().config().vocab_size, 258);
  const TrainResult r = trainer.run();
  EXPECT_EQ(io::read_text_file(r.checkpoint_dir + "/tokenizer.json"), io::read_text_file(root_ + "/tokenizer.json"));
  ASSERT_TRUE(r.last_eval);
  EXPECT_GT(r.last_eval->nats_per_byte, 0);
  EXPECT_LT(r.last_eval->nats_per_byte, r.last_eval->loss);  // more than one byte per token
}

TEST_P(TrainerFilesTest, RefusesToReplaceACheckpointUnlessResumeOrOverwrite) {
  TrainConfig c = config("refuse");
  c.seed = testing::fresh_seed();
  c.steps = 1;
  c.eval_batches = 1;
  Trainer(c).run();
  const std::string dir = c.resolved_checkpoint_dir();
  // Neither resume nor overwrite: refused, naming the directory, its step and both ways out.
  const std::string refused = testing::thrown_message<ValueError>([&] { Trainer{c}; });
  for (const std::string& part : {dir, std::string("already holds a checkpoint at step 1 of 1"),
                                  std::string("--resume"), std::string("--overwrite")}) {
    EXPECT_NE(refused.find(part), std::string::npos) << refused;
  }
  // overwrite: a fresh model that replaces it.
  TrainConfig overwrite = c;
  overwrite.overwrite = true;
  overwrite.steps = 2;
  Trainer fresh(overwrite);
  EXPECT_FALSE(fresh.resumed());
  EXPECT_EQ(fresh.step(), 0);
  fresh.run();
  const nlohmann::json state = nlohmann::json::parse(io::read_text_file(dir + "/trainer_state.json"));
  EXPECT_EQ(state["step"], 2);
  // resume_if_exists alone resumes it.
  TrainConfig if_exists = c;
  if_exists.resume_if_exists = true;
  if_exists.steps = 2;
  EXPECT_TRUE(Trainer(if_exists).resumed());
  // overwrite with resume contradicts itself.
  overwrite.resume = true;
  EXPECT_NE(testing::thrown_message<ValueError>([&] { overwrite.validate(); }).find("overwrite"), std::string::npos);
  // keep_best: an earlier run's best checkpoint is protected the same way.
  TrainConfig best = config("best_refuse");
  best.keep_best = true;
  write_directory_atomically(best.best_checkpoint_dir(), [](const std::string& tmp) {
    io::write_text_atomically(tmp + "/trainer_state.json", R"({"step": 1, "config": {"steps": 1}})");
  });
  EXPECT_NE(testing::thrown_message<ValueError>([&] { Trainer{best}; }).find(best.best_checkpoint_dir()),
            std::string::npos);
  // A directory of other files is not replaced either.
  TrainConfig other = config("other");
  write_directory_atomically(other.resolved_checkpoint_dir(),
                             [](const std::string& tmp) { io::write_text_atomically(tmp + "/notes.txt", "mine"); });
  EXPECT_NE(testing::thrown_message<ValueError>([&] { Trainer{other}; }).find("not a checkpoint"), std::string::npos);
  other.overwrite = true;
  EXPECT_NO_THROW(Trainer{other});
}

TEST_P(TrainerFilesTest, ResumeWithoutACheckpointIsRefusedUnlessResumeIfExists) {
  TrainConfig c = config("nothing_to_resume");
  c.seed = testing::fresh_seed();
  c.resume = true;
  const std::string refused = testing::thrown_message<ValueError>([&] { Trainer{c}; });
  EXPECT_NE(refused.find(c.resolved_checkpoint_dir()), std::string::npos) << refused;
  EXPECT_NE(refused.find("no checkpoint"), std::string::npos) << refused;
  EXPECT_NE(refused.find("--resume-if-exists"), std::string::npos) << refused;
  c.resume_if_exists = true;
  Trainer fresh(c);
  EXPECT_FALSE(fresh.resumed());
  EXPECT_EQ(fresh.step(), 0);
}

TEST_P(TrainerFilesTest, WarnsWhenTheStepsEndBeforeTheWarmup) {
  TrainConfig c = config("warmup");
  c.steps = 1 + static_cast<int64_t>(testing::fresh_seed() % 20);
  c.warmup_steps = c.steps;
  EXPECT_TRUE(c.warnings().empty()) << "the last step reaches the peak";
  c.warmup_steps = c.steps + 1;
  const std::vector<std::string> warnings = c.warnings();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("steps " + std::to_string(c.steps) + " "), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("warmup_steps " + std::to_string(c.warmup_steps)), std::string::npos) << warnings[0];
}

TEST_P(TrainerFilesTest, AnUnknownModelNamesThePresets) {
  TrainConfig c = config("huge");
  c.model = "huge";
  const std::string message = testing::thrown_message<ValueError>([&] { c.validate(); });
  EXPECT_NE(message.find("'huge'"), std::string::npos) << message;
  EXPECT_NE(message.find("tiny, model-s, model-m"), std::string::npos) << message;
  EXPECT_NE(message.find("config.json"), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(Host, TrainerFilesTest, ::testing::Values(Device::cpu()), testing::device_test_name);

}  // namespace
}  // namespace microllm::train
