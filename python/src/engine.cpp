// microllm._Engine: the serving engine (generate::Engine, continuous batching over a paged KV cache) for a batch
// of prompts, each with its own sampling parameters; python/microllm/llm.py's LLM and SamplingParams wrap it with
// the names vLLM users know. Each request's text is made as `microllm serve` makes it (engine_loop.cpp): the
// folder's stop ids end it (not decoded), the tokenizer's StreamDecoder (or bytes) turns ids into text, stop
// strings cut it. Steps run with the GIL released; between steps Ctrl-C cancels every request and raises.
#include <pybind11/stl.h>

#include <algorithm>

#include "microllm/core/error.h"
#include "microllm/generate/engine.h"
#include "microllm/generate/stop.h"
#include "microllm/models/config.h"
#include "model_bindings.h"

namespace microllm::python {

namespace {

// One request's text as the engine's thread builds it, token by token.
struct RequestState {
  std::vector<int32_t> prompt;
  std::vector<int64_t> stop_ids;
  int64_t max_tokens = 0;
  std::shared_ptr<void> decoder_state;
  generate::TextDecoder decoder;
  generate::StopStringMatcher matcher;
  std::vector<int32_t> tokens;
  std::string text;
  std::string finish_reason;  // vLLM's: "stop" (stop id or string), "length" (max_tokens or the window), "abort"
  bool ended = false;

  void end(const std::string& reason) {
    ended = true;
    finish_reason = reason;
  }
  // The decoder's and the matcher's tails, at an end that no stop string caused.
  void finish_text(const std::string& reason) {
    if (decoder.finish) text += matcher.push(decoder.finish());
    if (!matcher.stopped()) text += matcher.flush();
    end(matcher.stopped() ? "stop" : reason);
  }
  // Whether the sequence goes on.
  bool on_token(int32_t token) {
    if (ended) return false;
    tokens.push_back(token);
    if (std::find(stop_ids.begin(), stop_ids.end(), int64_t{token}) != stop_ids.end()) {  // not decoded
      finish_text("stop");
      return false;
    }
    text += matcher.push(decoder.push(token));
    if (matcher.stopped()) {
      end("stop");
      return false;
    }
    if (static_cast<int64_t>(tokens.size()) >= max_tokens) {
      finish_text("length");
      return false;
    }
    return true;
  }
};

template <typename T>
std::optional<T> optional_item(const py::dict& params, const char* key) {
  if (!params.contains(key) || params[key].is_none()) return std::nullopt;
  return params[key].cast<T>();
}

class EngineBinding {
 public:
  EngineBinding(ModelHandle model, int64_t max_batch, int64_t kv_blocks, int64_t block_size, int64_t prefill_chunk)
      : model_(std::move(model)) {
    generate::EngineOptions options;
    options.max_batch = max_batch;
    options.kv_blocks = kv_blocks;
    options.block_size = block_size;
    options.prefill_chunk = prefill_chunk;
    options.dtype = model_->dtype;
    py::gil_scoped_release no_gil;
    engine_ = std::make_unique<generate::Engine>(*model_->model, options);
  }

  // prompts: text or ids each; params: one dict per prompt (SamplingParams.to_dict()). Returns one dict per
  // prompt: prompt_token_ids, token_ids, text, finish_reason.
  py::list generate(const py::sequence& prompts, const py::sequence& params) {
    MICROLLM_CHECK(py::len(prompts) == py::len(params), ValueError, "LLM.generate", py::len(prompts),
                   " prompts and ", py::len(params), " sampling parameter sets");
    std::vector<std::shared_ptr<RequestState>> states;
    std::vector<generate::EngineRequest> requests;
    for (size_t i = 0; i < py::len(prompts); ++i) {
      auto state = std::make_shared<RequestState>();
      requests.push_back(request(prompts[i], py::reinterpret_borrow<py::dict>(params[i]), *state));
      states.push_back(std::move(state));
    }
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < requests.size(); ++i) {
      RequestState* state = states[i].get();
      requests[i].on_token = [state](int32_t token) { return state->on_token(token); };
      requests[i].on_finish = [state](const generate::Generation& g) {
        if (state->ended) return;
        if (g.finish_reason == generate::FinishReason::callback)
          state->end("abort");
        else
          state->finish_text("length");  // max tokens or the model's window
      };
      try {
        ids.push_back(engine_->submit(std::move(requests[i])));
      } catch (...) {  // a request that can never run: the ones queued before it leave too
        for (uint64_t id : ids) engine_->cancel(id);
        run_until_idle();
        throw;
      }
    }
    while (!engine_->idle()) {
      {
        py::gil_scoped_release no_gil;
        engine_->step();
      }
      if (PyErr_CheckSignals() != 0) {
        py::error_already_set interrupt;  // fetched; raised again once the requests are gone
        for (uint64_t id : ids) engine_->cancel(id);
        run_until_idle();
        throw interrupt;
      }
    }
    py::list out;
    for (const auto& state : states) {
      py::dict d;
      d["prompt_token_ids"] = state->prompt;
      d["token_ids"] = state->tokens;
      d["text"] = python_text(state->text);
      d["finish_reason"] = state->finish_reason;
      out.append(d);
    }
    return out;
  }

  py::dict stats() const {
    const generate::EngineStats s = engine_->stats();
    py::dict d;
    d["steps"] = s.steps;
    d["decode_steps"] = s.decode_steps;
    d["prefill_forwards"] = s.prefill_forwards;
    d["decoded_sequences"] = s.decoded_sequences;
    d["prompt_tokens"] = s.prompt_tokens;
    d["generated_tokens"] = s.generated_tokens;
    d["kv_blocks_total"] = s.kv_blocks_total;
    d["block_size"] = s.block_size;
    return d;
  }

  int64_t max_request_tokens() const { return engine_->max_request_tokens(); }
  const ModelHandle& model() const { return model_; }

 private:
  generate::EngineRequest request(py::handle prompt, const py::dict& params, RequestState& state) {
    const LoadedModel& m = *model_;
    state.prompt = prompt_ids(m, prompt, /*chat=*/false, std::nullopt, std::nullopt);
    std::vector<std::string> stop;
    if (auto list = optional_item<py::list>(params, "stop")) {
      for (py::handle s : *list) stop.push_back(text_bytes(s));
    }
    state.matcher = generate::StopStringMatcher(stop);
    state.max_tokens = optional_item<int64_t>(params, "max_tokens").value_or(16);
    if (!optional_item<bool>(params, "ignore_eos").value_or(false)) {
      state.stop_ids = models::stop_token_ids(m.directory, m.config(),
                                              m.tokenizer ? m.tokenizer->stop_ids(false) : std::vector<int32_t>{});
    }
    state.decoder = text_decoder(m, state.decoder_state);
    generate::EngineRequest r;
    r.prompt = state.prompt;
    r.max_new_tokens = state.max_tokens;
    generate::SamplingParams& s = r.sampling;
    s.temperature = optional_item<double>(params, "temperature").value_or(1.0);
    s.top_k = optional_item<int64_t>(params, "top_k").value_or(0);
    s.top_p = optional_item<double>(params, "top_p").value_or(1.0);
    s.min_p = optional_item<double>(params, "min_p").value_or(0.0);
    s.repetition_penalty = optional_item<double>(params, "repetition_penalty").value_or(1.0);
    s.presence_penalty = optional_item<double>(params, "presence_penalty").value_or(0.0);
    s.frequency_penalty = optional_item<double>(params, "frequency_penalty").value_or(0.0);
    s.seed = optional_item<uint64_t>(params, "seed").value_or(0);
    MICROLLM_CHECK(state.max_tokens >= 1, ValueError, "SamplingParams", "max_tokens must be >= 1, got ",
                   state.max_tokens);
    s.check();
    return r;
  }

  void run_until_idle() {
    py::gil_scoped_release no_gil;
    engine_->run_until_idle();
  }

  ModelHandle model_;
  std::unique_ptr<generate::Engine> engine_;
};

}  // namespace

void bind_engine(py::module_& m) {
  py::class_<EngineBinding>(m, "_Engine", "generate::Engine over a Model (use microllm.LLM)")
      .def(py::init<ModelHandle, int64_t, int64_t, int64_t, int64_t>(), py::arg("model"), py::arg("max_batch") = 32,
           py::arg("kv_blocks") = 0, py::arg("block_size") = 16, py::arg("prefill_chunk") = 512)
      .def("generate", &EngineBinding::generate, py::arg("prompts"), py::arg("params"))
      .def("stats", &EngineBinding::stats)
      .def_property_readonly("max_request_tokens", &EngineBinding::max_request_tokens)
      .def_property_readonly("model", &EngineBinding::model);
}

}  // namespace microllm::python
