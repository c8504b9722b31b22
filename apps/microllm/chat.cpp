// `microllm chat`: a conversation with a chat model, one user turn per line of stdin; the history is
// rendered with the model's chat template (tokenizer_config.json) and the reply streams to stdout.
//   microllm chat --model models/Qwen3-0.6B --system "Be brief." --no-think
//   printf 'Hi!\nAnd then?\n' | microllm chat --model models/Qwen2.5-0.5B-Instruct --temperature 0
// Commands: /exit (or end of input) ends, /reset forgets the conversation. On a terminal a "> " prompt
// is shown; with piped input only the replies are printed, one per turn. A line that is not UTF-8 is
// reported on stderr and skipped.
#include <unistd.h>

#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "inference.h"
#include "microllm/generate/generate.h"
#include "microllm/tokenizer/tokenizer.h"

namespace microllm::app {

namespace {

struct ChatCliOptions {
  std::string model;
  std::string system;
  bool no_think = false;
  bool verbose = false;
  generate::GenerateOptions options = [] {
    generate::GenerateOptions o;
    o.max_new_tokens = 1024;
    o.sampling.temperature = 0.8;
    return o;
  }();
  std::string device = "cpu";
  std::string dtype = "f32";
  int threads = 0;
};

std::string trim(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return {};
  return s.substr(begin, s.find_last_not_of(" \t\r\n") - begin + 1);
}

void run_chat(const ChatCliOptions& o, const CLI::App& cmd) {
  std::unique_ptr<nn::TransformerLM> model = load_inference_model(o.model, o.device, o.dtype, o.threads, o.verbose);
  const std::optional<Tokenizer> tokenizer = Tokenizer::load_if_present(o.model);
  MICROLLM_CHECK(tokenizer.has_value(), ValueError, "chat", o.model,
                 " has no tokenizer.json: chat needs a Hugging Face tokenizer with a chat template");
  MICROLLM_CHECK(tokenizer->chat_template_source().has_value(), ValueError, "chat", o.model,
                 "/tokenizer_config.json has no chat_template: this looks like a base model (use generate)");
  const ChatTemplate chat = tokenizer->chat_template();
  ChatOptions chat_options;  // add_generation_prompt
  if (o.no_think) {
    if (chat.reads_variable("enable_thinking"))
      chat_options.enable_thinking = false;
    else
      std::cerr << "warning: --no-think: the chat template reads no enable_thinking; ignored\n";
  }
  generate::GenerateOptions options = o.options;
  options.compute_dtype = parse_dtype(o.dtype);
  prepare_generate_options(o.model, cmd, model->config(), &*tokenizer, /*chat=*/true, options);
  const int64_t window = model->config().context_limit();

  const bool interactive = isatty(STDIN_FILENO) != 0;
  if (interactive) {
    std::cerr << "/exit or Ctrl-D ends, /reset forgets the conversation\n";
  }
  std::vector<ChatMessage> history;
  if (!o.system.empty()) history.push_back({"system", o.system});
  const size_t first_turn = history.size();  // the system message is never dropped
  std::string line;
  uint64_t line_number = 0;
  for (uint64_t turn = 0;; ++turn) {
    if (interactive) std::cout << "> " << std::flush;
    if (!std::getline(std::cin, line)) break;
    ++line_number;
    if (const size_t bad = first_invalid_utf8(line); bad != line.size()) {
      std::cerr << "[chat] line " << line_number << " is not UTF-8 (byte " << bad + 1 << " of it, 0x" << std::hex
                << static_cast<int>(static_cast<unsigned char>(line[bad])) << std::dec << "): skipped\n";
      continue;
    }
    const std::string text = trim(line);
    if (text.empty()) continue;
    if (text == "/exit" || text == "/quit") break;
    if (text == "/reset") {
      history.resize(first_turn);
      continue;
    }
    history.push_back({"user", text});
    // Render the conversation; drop the oldest exchanges while it does not fit the window.
    std::vector<int32_t> prompt;
    for (;;) {
      prompt = tokenizer->encode(chat.render(history, chat_options), /*add_special_tokens=*/false);
      if (static_cast<int64_t>(prompt.size()) < window || history.size() - first_turn <= 1) break;
      const auto oldest = history.begin() + static_cast<std::ptrdiff_t>(first_turn);
      history.erase(oldest,
                    oldest + std::min<std::ptrdiff_t>(2, static_cast<std::ptrdiff_t>(history.size() - first_turn) - 1));
      std::cerr << "[chat] the conversation outgrew the model's " << window << " positions: dropped the oldest turns\n";
    }
    if (static_cast<int64_t>(prompt.size()) >= window) {
      std::cerr << "[chat] this message alone (" << prompt.size() << " tokens with the template) does not fit the "
                << window << " positions of the model; not sent\n";
      history.pop_back();
      continue;
    }
    generate::GenerateOptions turn_options = options;
    turn_options.sampling.seed = options.sampling.seed + turn;
    std::shared_ptr<StreamDecoder> stream;
    const generate::Generation reply = generate::generate_text(
        *model, prompt, turn_options, make_text_decoder(tokenizer, stream), [](std::string_view piece) {
          std::cout << piece << std::flush;
          return true;
        });
    std::cout << "\n";
    if (interactive) std::cout << "\n";
    std::cout << std::flush;
    if (o.verbose) {
      std::cerr << "[chat] prompt " << prompt.size() << " tokens, reply " << reply.tokens.size()
                << " tokens, finish: " << generate::finish_reason_name(reply.finish_reason) << "\n";
    }
    history.push_back({"assistant", reply.text});
  }
}

}  // namespace

void register_chat(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("chat", "Talk with a chat model: one user turn per line of stdin");
  auto o = std::make_shared<ChatCliOptions>();
  cmd->add_option("-m,--model", o->model, "Hugging Face model directory with tokenizer.json and a chat template")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--system", o->system, "A system message first");
  cmd->add_flag("--no-think", o->no_think, "Qwen3: answer without reasoning (enable_thinking=false)");
  add_sampling_options(cmd, o->options);
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "Weights and compute: f32 or bf16")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (0: all)");
  cmd->add_flag("-v,--verbose", o->verbose, "Print the load report and per-turn counts to stderr");
  cmd->callback([o, cmd] { run_chat(*o, *cmd); });
}

}  // namespace microllm::app
