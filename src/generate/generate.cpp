#include "microllm/generate/generate.h"

#include <algorithm>

#include "microllm/autograd/variable.h"
#include "microllm/generate/kv_cache.h"
#include "microllm/generate/runner.h"
#include "microllm/ops/sampling.h"

namespace microllm::generate {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::length: return "length";
    case FinishReason::eos: return "eos";
    case FinishReason::stop_string: return "stop_string";
    case FinishReason::context: return "context";
    case FinishReason::callback: return "callback";
  }
  return "unknown";
}

namespace {

// The sampler state of a call, on the model's device: one row per sequence, sequence b seeded seed + b, counts
// from the prompts only when a penalty is on. Built once; each step then samples on the device and only the
// B chosen ids come back to the host. Every row shares the params, so a greedy call is greedy_only
// (make_sampler_rows sets it): two kernels per step on CUDA instead of the sort's dozen.
class DeviceSampler {
 public:
  DeviceSampler(const SamplingParams& params, const std::vector<std::vector<int32_t>>& prompts, int64_t vocab,
                Device device) {
    params.check();
    const std::vector<float> row = params.row();
    std::vector<float> rows_params;
    std::vector<int64_t> seeds;
    for (size_t b = 0; b < prompts.size(); ++b) {
      rows_params.insert(rows_params.end(), row.begin(), row.end());
      seeds.push_back(static_cast<int64_t>(params.seed + b));
    }
    rows_ =
        make_sampler_rows(rows_params, seeds, vocab, params.penalized() ? prompts : std::vector<std::vector<int32_t>>{},
                          device, std::vector<LogitBias>(prompts.size(), params.bias_row()));
    ids_ = Tensor::empty({static_cast<int64_t>(prompts.size())}, DType::i32, device);
  }

  // The next id of every sequence from logits [B, T, vocab] (the last position). The host waits here, once
  // per step, for B ids.
  std::vector<int32_t> next(const Tensor& logits) {
    sample_tokens(logits.select(1, logits.size(1) - 1), rows_, ids_);
    return ids_.to_vector<int32_t>();
  }

 private:
  SamplerRows rows_;
  Tensor ids_;
};

bool is_stop_id(const GenerateOptions& options, int32_t token) {
  return std::find(options.stop_ids.begin(), options.stop_ids.end(), int64_t{token}) != options.stop_ids.end();
}

void check_prompt(const char* op, const nn::TransformerConfig& config, const std::vector<int32_t>& prompt) {
  MICROLLM_CHECK(!prompt.empty(), ValueError, op, "the prompt is empty");
  for (int32_t id : prompt) {
    MICROLLM_CHECK(id >= 0 && id < config.vocab_size, ValueError, op, "prompt id ", id,
                   " is outside the vocabulary of ", config.vocab_size);
  }
  const auto prompt_length = static_cast<int64_t>(prompt.size());
  MICROLLM_CHECK(prompt_length < config.context_limit(), ValueError, op, "the prompt has ", prompt_length,
                 " tokens; the model's window is ", config.context_limit());
}

}  // namespace

std::vector<int32_t> generate(const nn::TransformerLM& model, const std::vector<int32_t>& prompt,
                              const GenerateOptions& options, const std::function<bool(int32_t)>& on_token) {
  MICROLLM_CHECK(options.max_new_tokens >= 0, ValueError, "generate", "max_new_tokens must be >= 0");
  MICROLLM_CHECK(options.stop_strings.empty(), ValueError, "generate",
                 "stop strings need text: use generate_text with a decoder");
  const nn::TransformerConfig& config = model.config();
  check_prompt("generate", config, prompt);
  const Device device = model.named_parameters().front().variable->device();
  const auto prompt_length = static_cast<int64_t>(prompt.size());
  const int64_t capacity = std::min(prompt_length + options.max_new_tokens, config.context_limit());
  autograd::NoGradGuard no_grad;
  const Runner runner(model, options.compute_dtype);
  ContiguousKvCache cache(config, 1, capacity, options.compute_dtype, device);
  DeviceSampler sampler(options.sampling, {prompt}, config.vocab_size, device);
  std::vector<int32_t> generated;
  std::vector<int64_t> step_ids(prompt.begin(), prompt.end());
  while (static_cast<int64_t>(generated.size()) < options.max_new_tokens &&
         cache.length() + static_cast<int64_t>(step_ids.size()) <= capacity) {
    const Tensor ids = Tensor::from_vector(step_ids, {1, static_cast<int64_t>(step_ids.size())}, device);
    const Tensor logits = runner.forward(ids, cache, LogitRows::last());  // [1, 1, vocab]
    const int32_t token = sampler.next(logits)[0];
    generated.push_back(token);
    if (on_token && !on_token(token)) break;
    if (is_stop_id(options, token)) break;
    step_ids.assign(1, token);
  }
  return generated;
}

Generation generate_text(const nn::TransformerLM& model, const std::vector<int32_t>& prompt,
                         const GenerateOptions& options, const TextDecoder& decoder,
                         const std::function<bool(std::string_view)>& on_text) {
  MICROLLM_CHECK(static_cast<bool>(decoder.push), ValueError, "generate_text", "the decoder has no push function");
  StopStringMatcher matcher(options.stop_strings);
  Generation out;
  bool cancelled = false;
  auto emit = [&](const std::string& piece) {
    if (piece.empty()) return;
    out.text += piece;
    if (on_text && !on_text(piece)) cancelled = true;
  };
  GenerateOptions ids_options = options;
  ids_options.stop_strings.clear();
  out.tokens = generate(model, prompt, ids_options, [&](int32_t token) {
    if (is_stop_id(options, token)) return true;  // generate() ends here; its text is not shown
    emit(matcher.push(decoder.push(token)));
    return !cancelled && !matcher.stopped();
  });
  if (!matcher.stopped() && !cancelled) {
    if (decoder.finish) emit(matcher.push(decoder.finish()));
    if (!matcher.stopped() && !cancelled) emit(matcher.flush());
  }
  if (matcher.stopped()) {
    out.finish_reason = FinishReason::stop_string;
  } else if (cancelled) {
    out.finish_reason = FinishReason::callback;
  } else if (!out.tokens.empty() && is_stop_id(options, out.tokens.back())) {
    out.finish_reason = FinishReason::eos;
  } else if (static_cast<int64_t>(out.tokens.size()) >= options.max_new_tokens) {
    out.finish_reason = FinishReason::length;
  } else {
    out.finish_reason = FinishReason::context;
  }
  return out;
}

std::vector<Generation> generate_batch(const nn::TransformerLM& model, const std::vector<std::vector<int32_t>>& prompts,
                                       const GenerateOptions& options,
                                       const std::function<bool(size_t, int32_t)>& on_token) {
  MICROLLM_CHECK(options.max_new_tokens >= 0, ValueError, "generate_batch", "max_new_tokens must be >= 0");
  MICROLLM_CHECK(options.stop_strings.empty(), ValueError, "generate_batch",
                 "stop strings need text: use generate_text with a decoder");
  const nn::TransformerConfig& config = model.config();
  for (const std::vector<int32_t>& prompt : prompts) check_prompt("generate_batch", config, prompt);
  const size_t batch = prompts.size();
  std::vector<Generation> out(batch);
  if (batch == 0 || options.max_new_tokens == 0) return out;

  const auto b64 = static_cast<int64_t>(batch);
  std::vector<int64_t> length(batch), pad(batch);
  int64_t longest = 0;
  for (size_t b = 0; b < batch; ++b) {
    length[b] = static_cast<int64_t>(prompts[b].size());
    longest = std::max(longest, length[b]);
  }
  bool padded = false;
  for (size_t b = 0; b < batch; ++b) {
    pad[b] = longest - length[b];
    padded = padded || pad[b] > 0;
  }
  // The last sampled token of a sequence is never fed back, hence the - 1.
  const int64_t capacity = longest + options.max_new_tokens - 1;
  const Device device = model.named_parameters().front().variable->device();
  autograd::NoGradGuard no_grad;
  const Runner runner(model, options.compute_dtype);
  ContiguousKvCache cache(config, b64, capacity, options.compute_dtype, device);

  DeviceSampler sampler(options.sampling, prompts, config.vocab_size, device);
  std::vector<bool> active(batch, true);
  size_t remaining = batch;

  // Padding keys [B, 1, 1, S]: key j of sequence b is real when j >= pad[b]; the cache narrows it to the keys of
  // each step (a view: no host work or upload per token). Without padding there is no mask, so an unpadded batch
  // takes the same kernels as a single sequence.
  if (padded) {
    std::vector<uint8_t> mask(static_cast<size_t>(b64 * capacity));
    for (size_t b = 0; b < batch; ++b) {
      for (int64_t j = 0; j < capacity; ++j)
        mask[b * static_cast<size_t>(capacity) + static_cast<size_t>(j)] = j >= pad[b];
    }
    cache.set_key_mask(Tensor::from_vector(mask, {b64, 1, 1, capacity}, device));
  }

  // Samples the next token of every active sequence from logits [B, T, vocab] (the last row).
  auto sample_step = [&](const Tensor& logits) {
    // Finished sequences are sampled too (their state is never read again); their ids are ignored.
    const std::vector<int32_t> tokens = sampler.next(logits);
    for (size_t b = 0; b < batch; ++b) {
      if (!active[b]) continue;
      const int32_t token = tokens[b];
      Generation& g = out[b];
      g.tokens.push_back(token);
      const auto generated = static_cast<int64_t>(g.tokens.size());
      bool done = true;
      if (on_token && !on_token(b, token)) {
        g.finish_reason = FinishReason::callback;
      } else if (is_stop_id(options, token)) {
        g.finish_reason = FinishReason::eos;
      } else if (generated >= options.max_new_tokens) {
        g.finish_reason = FinishReason::length;
      } else if (length[b] + generated > config.context_limit()) {  // no position left to feed it at
        g.finish_reason = FinishReason::context;
      } else {
        done = false;
      }
      if (done) {
        active[b] = false;
        --remaining;
      }
    }
  };

  {  // Prefill: [B, longest], padding on the left.
    std::vector<int64_t> ids(static_cast<size_t>(b64 * longest), 0), positions(ids.size(), 0);
    for (size_t b = 0; b < batch; ++b) {
      for (int64_t t = pad[b]; t < longest; ++t) {
        const size_t at = b * static_cast<size_t>(longest) + static_cast<size_t>(t);
        ids[at] = prompts[b][static_cast<size_t>(t - pad[b])];
        positions[at] = t - pad[b];
      }
    }
    cache.set_positions(Tensor::from_vector(positions, {b64, longest}, device));
    sample_step(runner.forward(Tensor::from_vector(ids, {b64, longest}, device), cache, LogitRows::last()));
  }
  while (remaining > 0) {  // Decode: one token per sequence; finished ones feed a dummy token, ignored.
    std::vector<int64_t> ids(batch, 0), positions(batch, 0);
    for (size_t b = 0; b < batch; ++b) {
      if (!active[b]) continue;
      ids[b] = out[b].tokens.back();
      positions[b] = length[b] + static_cast<int64_t>(out[b].tokens.size()) - 1;
    }
    cache.set_positions(Tensor::from_vector(positions, {b64, 1}, device));
    sample_step(runner.forward(Tensor::from_vector(ids, {b64, 1}, device), cache));
  }
  return out;
}

}  // namespace microllm::generate
