#include "microllm/generate/generate.h"

#include <algorithm>

#include "microllm/autograd/variable.h"

namespace microllm::generate {

std::vector<int32_t> generate(const nn::TransformerLM& model, const std::vector<int32_t>& prompt,
                              const GenerateOptions& options, const std::function<bool(int32_t)>& on_token) {
  MICROLLM_CHECK(!prompt.empty(), ValueError, "generate", "the prompt is empty");
  MICROLLM_CHECK(options.max_new_tokens >= 0, ValueError, "generate", "max_new_tokens must be >= 0");
  const nn::TransformerConfig& config = model.config();
  for (int32_t id : prompt) {
    MICROLLM_CHECK(id >= 0 && id < config.vocab_size, ValueError, "generate", "prompt id ", id,
                   " is outside the vocabulary of ", config.vocab_size);
  }
  const Device device = model.named_parameters().front().variable->device();
  const auto prompt_length = static_cast<int64_t>(prompt.size());
  MICROLLM_CHECK(prompt_length < config.max_position_embeddings, ValueError, "generate", "the prompt has ",
                 prompt_length, " tokens; the model's window is ", config.max_position_embeddings);
  const int64_t capacity = std::min(prompt_length + options.max_new_tokens, config.max_position_embeddings);
  autograd::NoGradGuard no_grad;
  nn::KvCache cache(config, 1, capacity, options.compute_dtype, device);
  nn::ForwardContext ctx;
  ctx.compute_dtype = options.compute_dtype;
  ctx.cache = &cache;
  Sampler sampler(options.sampling);
  std::vector<int32_t> history = prompt, generated;
  std::vector<int64_t> step_ids(prompt.begin(), prompt.end());
  while (static_cast<int64_t>(generated.size()) < options.max_new_tokens &&
         cache.length() + static_cast<int64_t>(step_ids.size()) <= capacity) {
    const Tensor ids = Tensor::from_vector(step_ids, {1, static_cast<int64_t>(step_ids.size())}, device);
    const Tensor logits = model.forward(ids, ctx).value();  // [1, T, vocab]
    const std::vector<float> last =
        logits.select(1, logits.size(1) - 1).reshape({-1}).to_vector<float>();  // the host waits here, once per token
    const int32_t token = sampler.sample(last, history);
    generated.push_back(token);
    history.push_back(token);
    if (on_token && !on_token(token)) break;
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), int64_t{token}) != options.stop_ids.end()) break;
    step_ids.assign(1, token);
  }
  return generated;
}

}  // namespace microllm::generate
