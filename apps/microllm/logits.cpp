// `microllm logits`: the logits of a batch of token ids (and optionally a greedy continuation of the first
// sequence) from a model directory, written as safetensors, for parity checks against transformers
// (tools/oracle/parity_full.py, docs/parity.md).
//   microllm logits --model DIR --ids "1,2,3;4,5,6" --device cuda --dtype bf16 --out logits.safetensors --greedy 64
// The file holds "input_ids" [B, T] i64, "logits" [B, T, V] f32 (computed in --dtype, then widened) and, with
// --greedy N, "greedy_tokens" [N] i64: the argmax continuation of the first sequence (no stop ids; it ends
// early only at the model's max_position_embeddings). Timings go to stdout as one JSON line.
#include <chrono>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "token_ids.h"
#include "microllm/autograd/variable.h"
#include "microllm/core/cuda.h"
#include "microllm/core/threads.h"
#include "microllm/generate/generate.h"
#include "microllm/io/safetensors.h"
#include "microllm/models/loader.h"

namespace microllm::app {
namespace {

struct LogitsCliOptions {
  std::string model;
  std::string ids;
  std::string device = "cpu";
  std::string dtype = "f32";
  std::string out;
  int64_t greedy = 0;
  int threads = 0;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void sync(Device device) {
  if (device.is_cuda()) cuda::synchronize(device.index);
}

void run_logits(const LogitsCliOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  const Device device = Device::parse(o.device);
  const DType dtype = parse_dtype(o.dtype);
  MICROLLM_CHECK(dtype == DType::f32 || dtype == DType::bf16, ValueError, "logits", "--dtype must be f32 or bf16, got ",
                 o.dtype);
  const std::vector<std::vector<int64_t>> rows = parse_id_rows(o.ids, "logits");
  const auto batch = static_cast<int64_t>(rows.size());
  const auto tokens = static_cast<int64_t>(rows[0].size());
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());

  auto start = std::chrono::steady_clock::now();
  models::LoadOptions load;
  load.device = device;
  load.dtype = dtype;
  load.strict = true;
  models::LoadedModel loaded = models::load_model(o.model, load);
  sync(device);
  const double load_seconds = seconds_since(start);
  const nn::TransformerLM& model = *loaded.model;
  const int64_t vocab = model.config().vocab_size;
  for (int64_t id : flat) {
    MICROLLM_CHECK(id >= 0 && id < vocab, ValueError, "logits", "--ids: id ", id, " is outside the vocabulary of ",
                   vocab);
  }
  MICROLLM_CHECK(tokens <= model.config().max_position_embeddings, ValueError, "logits", "--ids: ", tokens,
                 " tokens exceed the model's window of ", model.config().max_position_embeddings);

  const Tensor ids = Tensor::from_vector(flat, {batch, tokens});
  Tensor logits;
  start = std::chrono::steady_clock::now();
  {
    autograd::NoGradGuard no_grad;
    nn::ForwardContext ctx;
    ctx.compute_dtype = dtype;
    logits = model.forward(ids.to(device), ctx).value().to(Device::cpu(), DType::f32);  // [B, T, V]
  }
  const double forward_seconds = seconds_since(start);

  std::vector<std::pair<std::string, Tensor>> tensors{{"input_ids", ids}, {"logits", logits}};
  double greedy_seconds = 0;
  size_t greedy_count = 0;
  if (o.greedy > 0) {
    generate::GenerateOptions options;
    options.max_new_tokens = o.greedy;
    options.sampling.temperature = 0;  // argmax
    options.compute_dtype = dtype;     // no stop ids: exactly N tokens unless the window ends first
    const std::vector<int32_t> prompt(rows[0].begin(), rows[0].end());
    start = std::chrono::steady_clock::now();
    const std::vector<int32_t> generated = generate::generate(model, prompt, options);
    greedy_seconds = seconds_since(start);
    greedy_count = generated.size();
    const std::vector<int64_t> wide(generated.begin(), generated.end());
    tensors.emplace_back("greedy_tokens", Tensor::from_vector(wide, {static_cast<int64_t>(wide.size())}));
  }
  io::save_safetensors(o.out, tensors,
                       {{"format", "pt"}, {"model", o.model}, {"device", device.str()}, {"dtype", o.dtype}});
  const nlohmann::json report = {{"out", o.out},
                                 {"batch", batch},
                                 {"tokens", tokens},
                                 {"vocab", vocab},
                                 {"device", device.str()},
                                 {"dtype", o.dtype},
                                 {"parameters", model.config().num_parameters()},
                                 {"load_seconds", load_seconds},
                                 {"forward_seconds", forward_seconds},
                                 {"greedy_tokens", greedy_count},
                                 {"greedy_seconds", greedy_seconds}};
  std::cout << report.dump() << std::endl;
}

}  // namespace

void register_logits(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("logits", "Logits (and a greedy continuation) of token ids, as safetensors");
  auto o = std::make_shared<LogitsCliOptions>();
  cmd->add_option("--model", o->model, "Model directory (config.json + model.safetensors or shards)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--ids", o->ids, "Token ids: sequences of equal length, e.g. \"1,2,3;4,5,6\"")->required();
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "Weights and compute dtype: f32 or bf16")->capture_default_str();
  cmd->add_option("--out", o->out, "Output .safetensors: input_ids, logits [B, T, V] f32, greedy_tokens")->required();
  cmd->add_option("--greedy", o->greedy, "Also generate N greedy tokens after the first sequence")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--threads", o->threads, "CPU threads (0: all)");
  cmd->callback([o] { run_logits(*o); });
}

}  // namespace microllm::app
