// Model.generate: `microllm generate` from Python. The prompt, the sampling defaults (generation_config.json's for
// what the caller leaves unset), the stop ids and the text decoder are the CLI's, so the text is the CLI's.
//
// The model computes with the GIL released. Between tokens the per-token hook (the text decoder's push, which
// generate_text calls once per generated id) takes the GIL to run Python's signal handlers: Ctrl-C raises
// KeyboardInterrupt out of generate() at the next token. stream=True returns a TextStream: generation runs on a
// worker thread that never touches Python, pieces pass through a queue, and __next__ waits for one with the GIL
// released (checking signals every 50 ms); dropping or closing the stream stops the worker at its next token.
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "microllm/core/error.h"
#include "microllm/generate/stop.h"
#include "microllm/models/config.h"
#include "microllm/train/data.h"
#include "model_bindings.h"

namespace microllm::python {

std::vector<int32_t> prompt_ids(const LoadedModel& m, py::handle prompt, bool chat, const std::optional<std::string>& system,
                                std::optional<bool> enable_thinking) {
  std::vector<int32_t> ids;
  if (chat) {
    MICROLLM_CHECK(m.tokenizer.has_value(), ValueError, "generate", "chat=True needs a tokenizer (tokenizer.json) in ",
                   m.directory);
    const ChatTemplate chat_template = m.tokenizer->chat_template();
    // enable_thinking reaches only a template that reads it (the CLI warns and ignores --no-think otherwise).
    if (!chat_template.reads_variable("enable_thinking")) enable_thinking.reset();
    std::string text;
    if (py::isinstance<py::str>(prompt)) {
      std::vector<ChatMessage> messages;
      if (system && !system->empty()) messages.push_back({"system", *system});
      messages.push_back({"user", text_bytes(prompt)});
      text = chat_template.render(messages, ChatOptions{.add_generation_prompt = true, .enable_thinking = enable_thinking});
    } else {
      MICROLLM_CHECK(!system, ValueError, "generate", "system= goes with a text prompt; put it in the messages list");
      ChatTemplateInput input;
      input.messages_json = py::cast<std::string>(py::module_::import("json").attr("dumps")(prompt));
      input.add_generation_prompt = true;
      if (enable_thinking) input.variables_json = *enable_thinking ? R"({"enable_thinking": true})" : R"({"enable_thinking": false})";
      text = chat_template.render_json(input);
    }
    ids = m.tokenizer->encode(text, /*add_special_tokens=*/false);
  } else {
    MICROLLM_CHECK(!system && !enable_thinking, ValueError, "generate", "system= and enable_thinking= need chat=True");
    if (py::isinstance<py::str>(prompt) || py::isinstance<py::bytes>(prompt)) {
      const std::string text = text_bytes(prompt);
      ids = m.tokenizer ? m.tokenizer->encode(text, /*add_special_tokens=*/true) : train::ByteTokenizer().encode(text);
    } else if (!(py::isinstance<py::list>(prompt) && py::len(prompt) == 0)) {
      ids = id_list(prompt, "generate");
    }
  }
  if (ids.empty()) {  // an empty prompt starts from BOS
    if (m.config().bos_token_id >= 0)
      ids.push_back(static_cast<int32_t>(m.config().bos_token_id));
    else if (m.tokenizer && m.tokenizer->bos_id())
      ids.push_back(*m.tokenizer->bos_id());
  }
  MICROLLM_CHECK(!ids.empty(), ValueError, "generate", "the prompt is empty and ", m.directory,
                 " has no bos token to start from: give a prompt");
  return ids;
}

generate::GenerateOptions generate_options(const LoadedModel& m, const GenerateArguments& args) {
  generate::GenerateOptions options;
  options.max_new_tokens = args.max_tokens;
  options.compute_dtype = m.dtype;
  options.stop_strings = args.stop;
  options.stop_ids = models::stop_token_ids(m.directory, m.config(),
                                            m.tokenizer ? m.tokenizer->stop_ids(args.chat) : std::vector<int32_t>{});
  generate::SamplingParams& s = options.sampling;
  s.temperature = 0.8;  // the CLI's default
  // generation_config.json fills what the caller left unset, by the CLI's rules (prepare_generate_options).
  if (const std::optional<models::GenerationConfig> g = models::read_generation_config(m.directory)) {
    if (!g->do_sample.value_or(true))
      s.temperature = 0;
    else if (g->temperature)
      s.temperature = *g->temperature;
    if (g->top_k) s.top_k = static_cast<int64_t>(*g->top_k);
    if (auto v = g->top_p; v && *v > 0 && *v <= 1) s.top_p = *v;
    if (auto v = g->min_p; v && *v >= 0 && *v < 1) s.min_p = *v;
    if (auto v = g->repetition_penalty; v && *v > 0) s.repetition_penalty = *v;
  }
  if (args.temperature) s.temperature = *args.temperature;
  if (args.top_k) s.top_k = *args.top_k;
  if (args.top_p) s.top_p = *args.top_p;
  if (args.min_p) s.min_p = *args.min_p;
  if (args.repetition_penalty) s.repetition_penalty = *args.repetition_penalty;
  s.presence_penalty = args.presence_penalty;
  s.frequency_penalty = args.frequency_penalty;
  s.seed = args.seed;
  MICROLLM_CHECK(args.max_tokens >= 0, ValueError, "generate", "max_tokens must be >= 0, got ", args.max_tokens);
  s.check();
  return options;
}

namespace {

// Bytes of a byte-level model's ids, held back while they end inside a UTF-8 character: every piece then ends on
// a character boundary (or after bytes that can never be UTF-8), so pieces decode to str one by one.
struct ByteTextDecoder {
  std::string pending;
  std::string push(int32_t id) {
    const int32_t one[1] = {id};
    pending += train::ByteTokenizer().decode(one);
    const size_t keep = generate::incomplete_utf8_suffix(pending);
    std::string out = pending.substr(0, pending.size() - keep);
    pending.erase(0, pending.size() - keep);
    return out;
  }
  std::string finish() { return std::exchange(pending, {}); }
};

}  // namespace

generate::TextDecoder text_decoder(const LoadedModel& m, std::shared_ptr<void>& keep_alive) {
  if (m.tokenizer) {
    auto stream = std::make_shared<StreamDecoder>(m.tokenizer->stream_decoder(/*skip_special_tokens=*/true));
    keep_alive = stream;
    return {[s = stream.get()](int32_t id) { return s->push(id); }, [s = stream.get()] { return s->finish(); }};
  }
  auto bytes = std::make_shared<ByteTextDecoder>();
  keep_alive = bytes;
  return {[b = bytes.get()](int32_t id) { return b->push(id); }, [b = bytes.get()] { return b->finish(); }};
}

namespace {

// Thrown by the per-token hook to end a generation early (Ctrl-C, a closed stream). Not a std::exception, so
// nothing in the library mistakes it for an error of its own.
struct GenerationStopped {};

// A Python exception taken out of the interpreter's error indicator while the GIL is released, and put back.
struct PendingPythonError {
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  void fetch() { PyErr_Fetch(&type, &value, &traceback); }
  [[noreturn]] void raise() {
    PyErr_Restore(type, value, traceback);
    type = value = traceback = nullptr;
    throw py::error_already_set();
  }
};

// The decoder with the hook in front of each push.
generate::TextDecoder with_hook(generate::TextDecoder decoder, std::function<void()> hook) {
  return {[push = std::move(decoder.push), hook = std::move(hook)](int32_t id) {
            hook();
            return push(id);
          },
          std::move(decoder.finish)};
}

struct GenerateCall {
  ModelHandle model;
  std::vector<int32_t> prompt;
  generate::GenerateOptions options;
};

GenerateCall prepare(const ModelHandle& self, py::handle prompt, const GenerateArguments& args,
                     const std::optional<std::string>& system, std::optional<bool> enable_thinking) {
  return {self, prompt_ids(*self, prompt, args.chat, system, enable_thinking), generate_options(*self, args)};
}

generate::Generation run_blocking(const GenerateCall& call) {
  PendingPythonError interrupt;
  std::shared_ptr<void> keep_alive;
  const generate::TextDecoder decoder = with_hook(text_decoder(*call.model, keep_alive), [&interrupt] {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) {
      interrupt.fetch();
      throw GenerationStopped{};
    }
  });
  try {
    py::gil_scoped_release no_gil;
    return generate::generate_text(*call.model->model, call.prompt, call.options, decoder);
  } catch (const GenerationStopped&) {
    interrupt.raise();
  }
}

// Text pieces of one generation running on a worker thread (see the top of the file).
class TextStream {
 public:
  explicit TextStream(GenerateCall call) : call_(std::move(call)) {
    worker_ = std::thread([this] { run(); });
  }
  ~TextStream() { stop(); }
  TextStream(const TextStream&) = delete;
  TextStream& operator=(const TextStream&) = delete;

  py::str next() {
    while (true) {
      std::optional<std::string> piece;
      bool done = false;
      {
        py::gil_scoped_release no_gil;
        std::unique_lock lock(m_);
        cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return !pieces_.empty() || done_; });
        if (!pieces_.empty()) {
          piece = std::move(pieces_.front());
          pieces_.pop_front();
        } else {
          done = done_;
        }
      }
      if (piece) return python_text(*piece);
      if (done) {
        join();
        if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
        throw py::stop_iteration();
      }
      if (PyErr_CheckSignals() != 0) {
        PendingPythonError interrupt;
        interrupt.fetch();
        stop();
        interrupt.raise();
      }
    }
  }

  // Ends the generation at its next token and waits for the worker.
  void stop() {
    cancel_ = true;
    if (PyGILState_Check()) {
      py::gil_scoped_release no_gil;
      join();
    } else {
      join();
    }
  }

  bool finished() {
    std::lock_guard lock(m_);
    return done_ && pieces_.empty();
  }
  // The whole generation once the stream is exhausted (None before).
  std::optional<generate::Generation> result() {
    std::lock_guard lock(m_);
    if (!done_ || !pieces_.empty()) return std::nullopt;
    return result_;
  }

 private:
  void join() {
    if (worker_.joinable()) worker_.join();
  }

  void run() {
    std::shared_ptr<void> keep_alive;
    const generate::TextDecoder decoder = with_hook(text_decoder(*call_.model, keep_alive), [this] {
      if (cancel_) throw GenerationStopped{};
    });
    generate::Generation result;
    std::exception_ptr error;
    try {
      result = generate::generate_text(*call_.model->model, call_.prompt, call_.options, decoder,
                                       [this](std::string_view text) {
                                         std::lock_guard lock(m_);
                                         pieces_.emplace_back(text);
                                         cv_.notify_all();
                                         return true;
                                       });
    } catch (const GenerationStopped&) {
      result.finish_reason = generate::FinishReason::callback;
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard lock(m_);
    result_ = std::move(result);
    error_ = error;
    done_ = true;
    cv_.notify_all();
  }

  GenerateCall call_;
  std::atomic<bool> cancel_{false};
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::string> pieces_;
  bool done_ = false;
  generate::Generation result_;
  std::exception_ptr error_;
  std::thread worker_;  // last: starts after every member above exists
};

std::vector<std::string> stop_strings(const py::object& stop) {
  std::vector<std::string> out;
  if (stop.is_none()) return out;
  if (py::isinstance<py::str>(stop) || py::isinstance<py::bytes>(stop)) return {text_bytes(stop)};
  for (py::handle s : stop) out.push_back(text_bytes(s));
  return out;
}

py::object generate_method(const ModelHandle& self, const py::object& prompt, int64_t max_tokens,
                           std::optional<double> temperature, std::optional<int64_t> top_k,
                           std::optional<double> top_p, std::optional<double> min_p,
                           std::optional<double> repetition_penalty, double presence_penalty,
                           double frequency_penalty, uint64_t seed, const py::object& stop, bool chat,
                           const std::optional<std::string>& system, std::optional<bool> enable_thinking, bool stream,
                           bool details) {
  GenerateArguments args{.max_tokens = max_tokens,
                         .temperature = temperature,
                         .top_p = top_p,
                         .min_p = min_p,
                         .repetition_penalty = repetition_penalty,
                         .top_k = top_k,
                         .presence_penalty = presence_penalty,
                         .frequency_penalty = frequency_penalty,
                         .seed = seed,
                         .stop = stop_strings(stop),
                         .chat = chat};
  GenerateCall call = prepare(self, prompt, args, system, enable_thinking);
  MICROLLM_CHECK(!(stream && details), ValueError, "generate",
                 "stream=True returns a TextStream (its .result holds the details): details=True does not apply");
  if (stream) return py::cast(std::make_unique<TextStream>(std::move(call)));
  generate::Generation result = run_blocking(call);
  if (details) return py::cast(std::move(result));
  return python_text(result.text);
}

}  // namespace

void bind_generation(py::module_& m) {
  py::class_<generate::Generation>(m, "Generation", "One generation: its text, the generated ids, why it ended")
      .def_property_readonly("text", [](const generate::Generation& g) { return python_text(g.text); })
      .def_readonly("token_ids", &generate::Generation::tokens, "Generated ids (a stop id that ended it included)")
      .def_property_readonly(
          "finish_reason", [](const generate::Generation& g) { return generate::finish_reason_name(g.finish_reason); },
          "length, eos, stop_string, context or callback (stopped early)")
      .def("__repr__", [](const generate::Generation& g) {
        return str_cat("Generation(", std::string(py::repr(python_text(g.text))), ", ", g.tokens.size(), " tokens, ",
                       generate::finish_reason_name(g.finish_reason), ")");
      });

  py::class_<TextStream>(m, "TextStream", "The text of a generation as it is decoded (Model.generate(stream=True))")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &TextStream::next)
      .def("close", &TextStream::stop, "Stops the generation at its next token")
      .def_property_readonly("finished", &TextStream::finished)
      .def_property_readonly("result", &TextStream::result, "The Generation once the stream is exhausted, else None");

  auto model = py::reinterpret_borrow<py::class_<LoadedModel, ModelHandle>>(m.attr("Model"));
  model.def("generate", &generate_method, py::arg("prompt") = "", py::kw_only(), py::arg("max_tokens") = 200,
            py::arg("temperature") = py::none(), py::arg("top_k") = py::none(), py::arg("top_p") = py::none(),
            py::arg("min_p") = py::none(), py::arg("repetition_penalty") = py::none(),
            py::arg("presence_penalty") = 0.0, py::arg("frequency_penalty") = 0.0, py::arg("seed") = 0,
            py::arg("stop") = py::none(), py::arg("chat") = false, py::arg("system") = py::none(),
            py::arg("enable_thinking") = py::none(), py::arg("stream") = false, py::arg("details") = false,
            "Continues a prompt (text, or ids) or, with chat=True, answers it (a user message, or a list of message "
            "dicts) as `microllm generate` does: the same defaults (temperature 0.8 unless generation_config.json "
            "says otherwise, the folder's stop ids) and the same text. Returns the text; details=True a Generation; "
            "stream=True a TextStream of text pieces.");
}

}  // namespace microllm::python
