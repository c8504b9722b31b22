// `microllm generate`: continue a prompt (or answer it, with --chat) from a Hugging Face model directory or
// a trained checkpoint, with the KV cache, streaming text as it is decided.
//   microllm generate --model models/Qwen3-0.6B --prompt "Why is the sky blue?" --chat --max-tokens 200
//   microllm generate --model data/runs/tiny/checkpoint --prompt "In the beginning" --stop "\n\n"
//
// This file also holds what `microllm chat` (chat.cpp) shares with it: the sampling options, loading a
// model for inference, and the stop ids and defaults a model directory asks for.
#include "microllm/generate/generate.h"

#include <chrono>
#include <iostream>
#include <memory>
#include <optional>

#include "commands.h"
#include "inference.h"
#include "microllm/core/threads.h"
#include "microllm/models/config.h"
#include "microllm/models/loader.h"
#include "microllm/tokenizer/tokenizer.h"
#include "microllm/train/data.h"
#include "trace_file.h"

namespace microllm::app {

// ---- Shared with chat.cpp (inference.h) ----

void add_sampling_options(CLI::App* cmd, generate::GenerateOptions& options) {
  cmd->add_option("-n,--max-tokens", options.max_new_tokens, "Tokens to generate at most")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--temperature", options.sampling.temperature,
                  "0: greedy (default: generation_config.json's, else 0.8)");
  cmd->add_option("--top-k", options.sampling.top_k, "Keep the k most likely tokens (0: all)");
  cmd->add_option("--top-p", options.sampling.top_p, "Keep the smallest set with this probability mass (1: all)");
  cmd->add_option("--min-p", options.sampling.min_p, "Keep tokens at least this fraction as likely as the best");
  cmd->add_option("--repetition-penalty", options.sampling.repetition_penalty, "Demote tokens already seen (1: off)");
  cmd->add_option("--presence-penalty", options.sampling.presence_penalty, "Subtract from the logits of seen tokens");
  cmd->add_option("--frequency-penalty", options.sampling.frequency_penalty, "Subtract per occurrence of a seen token");
  cmd->add_option("--seed", options.sampling.seed, "Sampling seed (the same seed gives the same text)");
  cmd->add_option("--stop", options.stop_strings,
                  "Stop when the text contains this string (repeatable; \\n, \\t and \\\\ are understood)")
      ->allow_extra_args(false);
}

// The model of `directory` on `device` with parameters and compute in `dtype`.
std::unique_ptr<nn::TransformerLM> load_inference_model(const std::string& directory, const std::string& device,
                                                        const std::string& dtype, int threads, bool verbose) {
  if (threads > 0) set_num_threads(threads);
  models::LoadOptions load;
  load.device = Device::parse(device);
  load.dtype = parse_dtype(dtype);
  MICROLLM_CHECK(load.dtype == DType::f32 || load.dtype == DType::bf16, ValueError, "generate",
                 "--dtype must be f32 or bf16, got ", dtype);
  models::LoadedModel loaded = models::load_model(directory, load);
  if (verbose) std::cerr << "[model] " << loaded.report.summary() << "\n";
  loaded.model->fuse_projections();  // q/k/v and gate/up as one GEMM each
  return std::move(loaded.model);
}

namespace {

// "\n", "\t", "\r", "\\" in a command-line stop string.
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    if (c == 'n')
      out += '\n';
    else if (c == 't')
      out += '\t';
    else if (c == 'r')
      out += '\r';
    else if (c == '\\')
      out += '\\';
    else
      out += {'\\', c};
  }
  return out;
}

}  // namespace

void prepare_generate_options(const std::string& directory, const CLI::App& cmd, const nn::TransformerConfig& config,
                              const Tokenizer* tokenizer, bool chat, generate::GenerateOptions& options) {
  for (std::string& s : options.stop_strings) s = unescape(s);
  options.stop_ids =
      models::stop_token_ids(directory, config, tokenizer ? tokenizer->stop_ids(chat) : std::vector<int32_t>{});
  const std::optional<models::GenerationConfig> g = models::read_generation_config(directory);
  if (!g) return;
  auto given = [&](const char* flag) { return cmd.count(flag) > 0; };
  generate::SamplingParams& s = options.sampling;
  if (!given("--temperature")) {
    if (!g->do_sample.value_or(true))
      s.temperature = 0;
    else if (g->temperature)
      s.temperature = *g->temperature;
  }
  if (g->top_k && !given("--top-k")) s.top_k = static_cast<int64_t>(*g->top_k);
  if (auto v = g->top_p; v && !given("--top-p") && *v > 0 && *v <= 1) s.top_p = *v;
  if (auto v = g->min_p; v && !given("--min-p") && *v >= 0 && *v < 1) s.min_p = *v;
  if (auto v = g->repetition_penalty; v && !given("--repetition-penalty") && *v > 0) s.repetition_penalty = *v;
}

generate::TextDecoder make_text_decoder(const std::optional<Tokenizer>& tokenizer,
                                        std::shared_ptr<StreamDecoder>& keep_alive) {
  if (tokenizer) {
    keep_alive = std::make_shared<StreamDecoder>(tokenizer->stream_decoder(/*skip_special_tokens=*/true));
    StreamDecoder* stream = keep_alive.get();
    return {[stream](int32_t id) { return stream->push(id); }, [stream] { return stream->finish(); }};
  }
  return {[](int32_t id) {
            const int32_t one[1] = {id};
            return train::ByteTokenizer().decode(one);
          },
          nullptr};
}

// ---- microllm generate ----

namespace {

struct GenerateCliOptions {
  std::string model;
  std::optional<std::string> prompt;
  bool chat = false;
  std::string system;
  bool no_think = false;
  bool no_echo = false;
  bool verbose = false;
  generate::GenerateOptions options = [] {
    generate::GenerateOptions o;
    o.max_new_tokens = 200;
    o.sampling.temperature = 0.8;
    return o;
  }();
  std::string device = "cpu";
  std::string dtype = "f32";
  int threads = 0;
  std::string trace;
};

void run_generate(const GenerateCliOptions& o, const CLI::App& cmd) {
  std::unique_ptr<nn::TransformerLM> model = load_inference_model(o.model, o.device, o.dtype, o.threads, o.verbose);
  const std::optional<Tokenizer> hf = Tokenizer::load_if_present(o.model);
  const std::string prompt_text = o.prompt.value_or("");
  std::vector<int32_t> prompt;
  if (o.chat) {
    MICROLLM_CHECK(hf.has_value(), ValueError, "generate", "--chat needs a tokenizer (tokenizer.json) in ", o.model);
    const ChatTemplate chat = hf->chat_template();
    std::vector<ChatMessage> messages;
    if (!o.system.empty()) messages.push_back({"system", o.system});
    messages.push_back({"user", prompt_text});
    ChatOptions chat_options;
    if (o.no_think) {
      if (chat.reads_variable("enable_thinking"))
        chat_options.enable_thinking = false;
      else
        std::cerr << "warning: --no-think: the chat template reads no enable_thinking; ignored\n";
    }
    prompt = hf->encode(chat.render(messages, chat_options), /*add_special_tokens=*/false);
  } else {
    MICROLLM_CHECK(o.system.empty() && !o.no_think, ValueError, "generate", "--system and --no-think need --chat");
    prompt = hf ? hf->encode(prompt_text, /*add_special_tokens=*/true) : train::ByteTokenizer().encode(prompt_text);
  }
  if (prompt.empty()) {  // an empty prompt starts from BOS
    if (model->config().bos_token_id >= 0)
      prompt.push_back(static_cast<int32_t>(model->config().bos_token_id));
    else if (hf && hf->bos_id())
      prompt.push_back(*hf->bos_id());
  }
  // Models trained on raw text, such as a byte-level checkpoint of `microllm train`, have no bos token.
  MICROLLM_CHECK(!prompt.empty(), ValueError, "generate", "the prompt is empty and ", o.model,
                 " has no bos token to start from (bos_token_id in config.json, bos_token in tokenizer_config.json): "
                 "give --prompt TEXT");
  generate::GenerateOptions options = o.options;
  options.compute_dtype = parse_dtype(o.dtype);
  prepare_generate_options(o.model, cmd, model->config(), hf ? &*hf : nullptr, o.chat, options);

  if (!o.chat && !o.no_echo) std::cout << prompt_text << std::flush;
  std::shared_ptr<StreamDecoder> stream;
  const auto start = std::chrono::steady_clock::now();
  TraceFile trace(o.trace);
  const generate::Generation result =
      generate::generate_text(*model, prompt, options, make_text_decoder(hf, stream), [](std::string_view text) {
        std::cout << text << std::flush;
        return true;
      });
  std::cout << std::endl;
  trace.finish();
  if (o.verbose) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cerr << "[generate] prompt " << prompt.size() << " tokens, generated " << result.tokens.size() << " in "
              << seconds << " s (" << static_cast<double>(result.tokens.size()) / std::max(seconds, 1e-9)
              << " tokens/s), finish: " << generate::finish_reason_name(result.finish_reason) << "\n";
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("generate", "Continue a prompt (or answer it with --chat), streaming the text");
  auto o = std::make_shared<GenerateCliOptions>();
  cmd->add_option("-m,--model,--checkpoint", o->model,
                  "Model directory: Hugging Face (config.json, safetensors, tokenizer.json) or a checkpoint")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("-p,--prompt", o->prompt,
                  "Text to continue (none: start from the model's bos token; a model without one, such as a byte-level "
                  "checkpoint of `microllm train`, needs a prompt)");
  cmd->add_flag("--chat", o->chat,
                "Wrap the prompt in the model's chat template as a user turn, with the reply header");
  cmd->add_option("--system", o->system, "With --chat: a system message");
  cmd->add_flag("--no-think", o->no_think, "With --chat: Qwen3's enable_thinking=false");
  cmd->add_flag("--no-echo", o->no_echo, "Do not print the prompt before the continuation");
  add_sampling_options(cmd, o->options);
  add_trace_option(cmd, o->trace);
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "Weights and compute: f32 or bf16")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (0: all)");
  cmd->add_flag("-v,--verbose", o->verbose, "Print the load report and tokens/s to stderr");
  cmd->callback([o, cmd] { run_generate(*o, *cmd); });
}

}  // namespace microllm::app
