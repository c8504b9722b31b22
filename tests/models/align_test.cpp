// `microllm align` and the activation taps against transformers.
//   - A dump of the model's own taps (values and gradients) aligns exactly; the same model with one config field
//     broken (rope_theta) is reported at the first block's q after the rotary embedding, with exit status 2, and
//     an SVG of the error by depth is written.
//   - transformers' own values and gradients at every point (tests/fixtures/align/*.safetensors, written by
//     tools/oracle/align_reference.py --fixtures from tests/fixtures/models/) equal the taps on every test device:
//     f32 within 1e-4 relative error per point, bf16 within 5e-2; the broken model diverges from them at the
//     first block's q.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_testing.h"
#include "microllm/autograd/variable.h"
#include "microllm/io/safetensors.h"
#include "microllm/models/loader.h"
#include "microllm/nn/taps.h"
#include "test_support.h"

namespace microllm::models {
namespace {

namespace fs = std::filesystem;

fs::path fixture(const std::string& relative) { return fs::path(MICROLLM_SOURCE_DIR) / "tests/fixtures" / relative; }

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("microllm-align-" + name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// A copy of a fixture model directory with config.json's rope theta replaced.
fs::path broken_copy(const fs::path& model, const fs::path& where, double rope_theta) {
  fs::create_directories(where);
  for (const char* file : {"config.json", "model.safetensors"}) fs::copy_file(model / file, where / file);
  std::ifstream in(where / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  in.close();
  if (config.contains("rope_parameters")) {
    config["rope_parameters"]["rope_theta"] = rope_theta;
  } else {
    config["rope_theta"] = rope_theta;
  }
  std::ofstream(where / "config.json") << config.dump(2);
  return where;
}

// The model's own taps on random ids as a dump in align_reference.py's format.
void write_self_dump(const fs::path& model_dir, const fs::path& out) {
  models::LoadedModel loaded = models::load_model(model_dir.string());
  const int64_t vocab = loaded.model->config().vocab_size;
  const Tensor ids = testing::random_tensor({2, 6}, DType::i64, Device::cpu(), 0, static_cast<double>(vocab));
  const Tensor targets = testing::random_tensor({2, 6}, DType::i64, Device::cpu(), 0, static_cast<double>(vocab));
  nn::Taps taps;
  taps.with_gradients();
  nn::ForwardContext ctx;
  ctx.taps = &taps;
  loaded.model->loss(ids, targets, ctx).backward();
  std::vector<std::pair<std::string, Tensor>> tensors{{"input_ids", ids}, {"targets", targets}};
  for (const nn::TapRecord& r : taps.values()) tensors.emplace_back(r.name, r.tensor);
  for (const nn::TapRecord& r : taps.gradients()) tensors.emplace_back("grad/" + r.name, r.tensor);
  io::save_safetensors(out.string(), tensors, {{"dtype", "f32"}});
}

std::string align(const fs::path& model, const fs::path& dump, const std::string& extra, int& status) {
  std::string output;
  status = testing::run_command(testing::microllm_binary().string() + " align --model " + model.string() +
                                    " --reference " + dump.string() + " " + extra,
                                output);
  return output;
}

TEST(Align, OwnTapsAlignAndABrokenRopeIsFoundAtTheFirstBlocksQuery) {
  TempDir tmp("self");
  const fs::path model = fixture("models/qwen2"), dump = tmp.path / "dump.safetensors";
  write_self_dump(model, dump);

  int status = -1;
  std::string output = align(model, dump, "--backward --threads 1", status);
  EXPECT_EQ(status, 0) << output;
  EXPECT_NE(output.find("values: all 33 points within 1e-04"), std::string::npos) << output;
  EXPECT_NE(output.find("gradients: all 33 points within"), std::string::npos) << output;

  const fs::path broken = broken_copy(model, tmp.path / "broken", 10000.0);
  const fs::path svg = tmp.path / "depth.svg";
  output = align(broken, dump, "--backward --threads 1 --svg " + svg.string(), status);
  EXPECT_EQ(status, 2) << output;
  EXPECT_NE(output.find("values: first divergence at model.layers.0.self_attn.q_rotary"), std::string::npos)
      << output;
  EXPECT_NE(output.find("> model.layers.0.self_attn.q_rotary"), std::string::npos) << output;
  // The projections before it still agree.
  const std::string values_table = output.substr(0, output.find("gradients of the loss"));
  EXPECT_NE(values_table.find("  model.layers.0.self_attn.q_proj "), std::string::npos) << output;
  EXPECT_EQ(values_table.find("! model.layers.0.self_attn.q_proj"), std::string::npos) << output;
  std::ifstream in(svg);
  std::stringstream picture;
  picture << in.rdbuf();
  EXPECT_NE(picture.str().find("<svg"), std::string::npos);
  EXPECT_NE(picture.str().find("first divergence: model.layers.0.self_attn.q_rotary"), std::string::npos);
}

TEST(Align, RefusesADumpWithoutIdsOrGradients) {
  TempDir tmp("refuse");
  const fs::path bad = tmp.path / "bad.safetensors";
  io::save_safetensors(bad.string(), {{"logits", Tensor::ones({1, 2, 3})}});
  int status = -1;
  std::string output = align(fixture("models/qwen2"), bad, "", status);
  EXPECT_EQ(status, 1) << output;
  EXPECT_NE(output.find("has no 'input_ids' tensor"), std::string::npos) << output;

  const fs::path forward_only = tmp.path / "forward.safetensors";
  io::save_safetensors(forward_only.string(),
                       {{"input_ids", Tensor::ones({1, 2}, DType::i64)}, {"targets", Tensor::ones({1, 2}, DType::i64)}});
  output = align(fixture("models/qwen2"), forward_only, "--backward", status);
  EXPECT_EQ(status, 1) << output;
  EXPECT_NE(output.find("holds no gradients"), std::string::npos) << output;
}

// `microllm attention`: one row per query with its top keys, a heat map with one cell per query and key, all
// heads as safetensors (rows that sum to one), and errors that name the bad option.
TEST(AttentionCommand, TableHeatMapAndWeights) {
  TempDir tmp("attention");
  const fs::path svg = tmp.path / "head.svg", out = tmp.path / "weights.safetensors";
  std::string output;
  const std::string command = testing::microllm_binary().string() + " attention --model " +
                              fixture("models/qwen3").string() + " --ids 5,17,200,3,9 --head 3 --top 2";
  int status = testing::run_command(command + " --layer 1 --svg " + svg.string() + " --out " + out.string(), output);
  ASSERT_EQ(status, 0) << output;
  EXPECT_NE(output.find("layer 1, head 3"), std::string::npos) << output;
  EXPECT_NE(output.find("   0 #5  ->  0:#5 1.000"), std::string::npos) << output;  // the first query sees itself
  EXPECT_EQ(testing::count_of(output, "  ->  "), 5U) << output;
  std::ifstream in(svg);
  std::stringstream picture;
  picture << in.rdbuf();
  EXPECT_EQ(testing::count_of(picture.str(), "<rect x="), 5U * 5U + 10U) << "cells and the legend's ten shades";
  const io::SafetensorsFile weights = io::SafetensorsFile::open(out.string());
  const Tensor w = weights.get("attn_weights");
  ASSERT_EQ(w.shape(), (Shape{1, 4, 5, 5}));
  const std::vector<float> v = w.to_vector<float>();
  for (size_t row = 0; row < 4 * 5; ++row) {
    float sum = 0;
    for (size_t key = 0; key < 5; ++key) sum += v[row * 5 + key];
    EXPECT_NEAR(sum, 1.0F, 1e-5F) << "row " << row;
  }
  output.clear();
  EXPECT_EQ(testing::run_command(command + " --layer 2", output), 1);
  EXPECT_NE(output.find("layer 2 is outside the model's 2 layers"), std::string::npos) << output;
  output.clear();
  EXPECT_EQ(testing::run_command(command + " --layer 0 --prompt hi", output), 1);
  EXPECT_NE(output.find("exactly one of --prompt and --ids"), std::string::npos) << output;
}

// ---- against transformers ----

struct GoldenCase {
  std::string dump, model;
  DType dtype;
  double tolerance;
};

class AlignGoldenTest : public ::testing::TestWithParam<std::tuple<GoldenCase, Device>> {};

TEST_P(AlignGoldenTest, EveryPointEqualsTransformers) {
  const auto& [golden, device] = GetParam();
  MICROLLM_SKIP_IF_UNAVAILABLE(device);
  const fs::path dump_path = fixture("align/" + golden.dump + ".safetensors");
  if (!fs::exists(dump_path)) {
    GTEST_SKIP() << dump_path.string() << " is missing: run `python3 tools/oracle/align_reference.py --fixtures` "
                 << "where torch and transformers are installed (the GPU machine) and commit tests/fixtures/align/";
  }
  const io::SafetensorsFile dump = io::SafetensorsFile::open(dump_path.string());
  models::LoadOptions load;
  load.device = device;
  load.dtype = golden.dtype;
  models::LoadedModel loaded = models::load_model(fixture("models/" + golden.model).string(), load);
  nn::Taps taps({"*", "*attn_weights"});
  taps.with_gradients();
  nn::ForwardContext ctx;
  ctx.compute_dtype = golden.dtype;
  ctx.taps = &taps;
  loaded.model->loss(dump.get("input_ids").to(device), dump.get("targets").to(device), ctx).backward();

  size_t compared = 0, gradients = 0;
  for (const io::TensorInfo& info : dump.tensors()) {
    if (info.name == "input_ids" || info.name == "targets") continue;
    const bool is_gradient = info.name.rfind("grad/", 0) == 0;
    const std::string point = is_gradient ? info.name.substr(5) : info.name;
    const Tensor* ours = is_gradient ? taps.gradient(point) : taps.value(point);
    ASSERT_NE(ours, nullptr) << info.name << " has no tap";
    const Tensor mine = ours->to(Device::cpu(), DType::f32);
    ASSERT_EQ(mine.shape(), info.shape) << info.name;
    EXPECT_LE(testing::relative_error(mine, dump.get(info.name)), golden.tolerance) << info.name;
    ++compared;
    gradients += is_gradient;
  }
  EXPECT_GT(compared, 60U);
  EXPECT_GT(gradients, 30U);
}

std::string golden_name(const ::testing::TestParamInfo<std::tuple<GoldenCase, Device>>& info) {
  const Device device = std::get<1>(info.param);
  return std::get<0>(info.param).dump + "_" + (device.is_cuda() ? "cuda" : "cpu");
}

INSTANTIATE_TEST_SUITE_P(Transformers, AlignGoldenTest,
                         ::testing::Combine(::testing::Values(GoldenCase{"qwen2_f32", "qwen2", DType::f32, 1e-4},
                                                              GoldenCase{"qwen3_f32", "qwen3", DType::f32, 1e-4},
                                                              GoldenCase{"qwen2_bf16", "qwen2", DType::bf16, 5e-2}),
                                            ::testing::ValuesIn(testing::test_devices())),
                         golden_name);

// The demo of docs/PROFILING.md: a config with one wrong rope theta, against transformers' dump of the right one.
TEST(Align, ABrokenRopeIsFoundAtTheFirstBlocksQueryAgainstTransformers) {
  const fs::path dump = fixture("align/qwen3_f32.safetensors");
  if (!fs::exists(dump)) GTEST_SKIP() << dump.string() << " is missing (tools/oracle/align_reference.py --fixtures)";
  TempDir tmp("golden-broken");
  const fs::path broken = broken_copy(fixture("models/qwen3"), tmp.path / "qwen3", 10000.0);
  int status = -1;
  const std::string output = align(broken, dump, "--threads 1", status);
  EXPECT_EQ(status, 2) << output;
  EXPECT_NE(output.find("values: first divergence at model.layers.0.self_attn.q_rotary"), std::string::npos)
      << output;
  int good_status = -1;
  const std::string good = align(fixture("models/qwen3"), dump, "--backward --threads 1", good_status);
  EXPECT_EQ(good_status, 0) << good;
}

}  // namespace
}  // namespace microllm::models
