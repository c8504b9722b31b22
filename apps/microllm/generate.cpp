// `microllm generate`: sample text from a trained checkpoint (or a Hugging Face model directory of a
// supported family) with the KV cache, streaming tokens as they come.
//   microllm generate --checkpoint data/runs/tiny/checkpoint --prompt "In the beginning" --max-tokens 200
#include "microllm/generate/generate.h"

#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "commands.h"
#include "microllm/core/threads.h"
#include "microllm/tokenizer/tokenizer.h"
#include "microllm/models/loader.h"
#include "microllm/train/checkpoint.h"
#include "microllm/train/data.h"

namespace microllm::app {
namespace {

struct GenerateCliOptions {
  std::string checkpoint;
  std::string prompt;
  int64_t max_tokens = 200;
  generate::SamplingParams sampling{.temperature = 0.8};
  std::string device = "cpu";
  std::string dtype = "f32";
  int threads = 0;
};

void run_generate(const GenerateCliOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  std::unique_ptr<nn::TransformerLM> model = models::load_model(o.checkpoint).model;
  const Device device = Device::parse(o.device);
  model->to(device);
  std::optional<Tokenizer> hf;
  if (std::filesystem::exists(std::filesystem::path(o.checkpoint) / "tokenizer.json"))
    hf = Tokenizer::load(o.checkpoint);
  const train::ByteTokenizer bytes;
  std::vector<int32_t> prompt = hf ? hf->encode(o.prompt) : bytes.encode(o.prompt);
  if (prompt.empty() && model->config().bos_token_id >= 0)
    prompt.push_back(static_cast<int32_t>(model->config().bos_token_id));
  MICROLLM_CHECK(!prompt.empty(), ValueError, "generate", "the prompt is empty");
  generate::GenerateOptions options;
  options.max_new_tokens = o.max_tokens;
  options.sampling = o.sampling;
  options.stop_ids = model->config().eos_token_ids;
  options.compute_dtype = parse_dtype(o.dtype);
  std::cout << o.prompt << std::flush;
  std::optional<StreamDecoder> stream;
  if (hf) stream.emplace(hf->stream_decoder(true));
  generate::generate(*model, prompt, options, [&](int32_t token) {
    if (stream) {
      std::cout << stream->push(token);
    } else {
      const int32_t one[1] = {token};
      std::cout << bytes.decode(one);
    }
    std::cout.flush();
    return true;
  });
  if (stream) std::cout << stream->finish();
  std::cout << std::endl;
}

}  // namespace

void register_generate(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("generate", "Sample text from a trained checkpoint, streaming it");
  auto o = std::make_shared<GenerateCliOptions>();
  cmd->add_option("--checkpoint", o->checkpoint, "Checkpoint directory (config.json + model.safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--prompt", o->prompt, "Text to continue")->required();
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens to generate")->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", o->sampling.temperature, "0: greedy")->capture_default_str();
  cmd->add_option("--top-k", o->sampling.top_k, "Keep the k most likely tokens (0: all)");
  cmd->add_option("--top-p", o->sampling.top_p, "Keep the smallest set with this probability mass (1: all)");
  cmd->add_option("--min-p", o->sampling.min_p, "Keep tokens at least this fraction as likely as the best");
  cmd->add_option("--repetition-penalty", o->sampling.repetition_penalty, "Demote tokens already seen (1: off)");
  cmd->add_option("--presence-penalty", o->sampling.presence_penalty, "Subtract from the logits of seen tokens");
  cmd->add_option("--frequency-penalty", o->sampling.frequency_penalty, "Subtract per occurrence of a seen token");
  cmd->add_option("--seed", o->sampling.seed, "Sampling seed (the same seed gives the same text)");
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N");
  cmd->add_option("--dtype", o->dtype, "Compute dtype: f32 or bf16");
  cmd->add_option("--threads", o->threads, "CPU threads (0: all)");
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace microllm::app
