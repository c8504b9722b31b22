// libFuzzer target: an HTTP request body -> serve::parse_completion_request, as /v1/completions and as
// /v1/chat/completions. An ApiError with status 400 (and an OpenAI error object that is valid JSON) is the
// accepted answer to bad input; a crash, a sanitizer report, a hang, any other exception (a JSON library
// error escaping as a 500), an accepted request outside the documented ranges, or a response echoing it that is
// not valid JSON naming the same model is a bug.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "serve/openai_api.h"

namespace {

using microllm::serve::ApiError;
using microllm::serve::CompletionRequest;
using microllm::serve::Endpoint;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

// What parse_completion_request promises of a request it accepts (openai_api.h).
void check_ranges(const CompletionRequest& r, Endpoint endpoint) {
  check(r.endpoint == endpoint);
  check(!r.max_tokens || *r.max_tokens >= 1);
  check(r.temperature >= 0 && r.temperature <= 2);
  check(r.top_p > 0 && r.top_p <= 1);
  check(r.presence_penalty >= -2 && r.presence_penalty <= 2);
  check(r.frequency_penalty >= -2 && r.frequency_penalty <= 2);
  check(r.top_k >= 0);
  check(r.min_p >= 0 && r.min_p < 1);
  check(r.repetition_penalty > 0 && r.repetition_penalty <= 100);
  for (const auto& [id, bias] : r.logit_bias) check(id >= 0 && bias >= -100 && bias <= 100);
  check(!r.include_usage || r.stream);
  check(!r.echo || endpoint == Endpoint::completions);
  check(r.stop.size() <= 16);
  for (const std::string& s : r.stop) check(!s.empty());
  if (endpoint == Endpoint::chat_completions) check(!r.messages.empty());
  if (r.prompt_ids) {
    for (int32_t id : *r.prompt_ids) check(id >= 0);
  }
}

// The bodies that echo the request's model name parse back to it.
void check_echo(const CompletionRequest& r) {
  const microllm::serve::ResponseInfo info{r.endpoint, "cmpl-fuzz", 0, r.model};
  const nlohmann::json whole =
      nlohmann::json::parse(microllm::serve::completion_body(info, "text", "stop", {1, 1}));
  check(whole.at("model") == r.model);
  const nlohmann::json chunk = nlohmann::json::parse(microllm::serve::chunk_body(info, "text", true));
  check(chunk.at("model") == r.model);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (Endpoint endpoint : {Endpoint::completions, Endpoint::chat_completions}) {
    CompletionRequest request;
    try {
      request = microllm::serve::parse_completion_request(body, endpoint);
    } catch (const ApiError& error) {
      check(error.status == 400);
      check(nlohmann::json::parse(microllm::serve::error_body(error)).at("error").at("message").is_string());
      continue;
    }
    check_ranges(request, endpoint);
    check_echo(request);
  }
  return 0;
}
