// The OpenAI wire format, without sockets: parsing and validating /v1/completions and /v1/chat/completions
// request bodies, and building the JSON of responses, stream chunks, errors and /v1/models.
// Private to the serve layer (tests include it through src/).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "microllm/tokenizer/chat_template.h"

namespace microllm::serve {

// An error for the client: an HTTP status and an OpenAI error object.
class ApiError : public std::runtime_error {
 public:
  ApiError(int http_status, const std::string& message, std::string error_type = "invalid_request_error",
           std::string error_param = "", std::string error_code = "")
      : std::runtime_error(message), status(http_status), type(std::move(error_type)), param(std::move(error_param)),
        code(std::move(error_code)) {}
  int status;
  std::string type;   // invalid_request_error, authentication_error, not_found_error, server_error
  std::string param;  // the offending field ("" -> null)
  std::string code;   // a machine-readable code ("" -> null)
};

// {"error": {"message": ..., "type": ..., "param": ... | null, "code": ... | null}}
std::string error_body(const ApiError& error);

enum class Endpoint { completions, chat_completions };
const char* endpoint_path(Endpoint endpoint);  // "/v1/completions", "/v1/chat/completions"

struct CompletionRequest {
  Endpoint endpoint = Endpoint::completions;
  std::string model;                        // as sent ("" when absent)
  std::string prompt;                       // completions: the text ...
  std::optional<std::vector<int32_t>> prompt_ids;  // ... or token ids
  std::vector<ChatMessage> messages;        // chat completions
  std::optional<int64_t> max_tokens;        // >= 1; max_completion_tokens is an alias in chat
  double temperature = 1.0;                 // [0, 2]; 0: greedy
  double top_p = 1.0;                       // (0, 1]
  int64_t top_k = 0;                        // vLLM's extension: 0 or -1: off
  double min_p = 0.0;                       // vLLM's extension: [0, 1)
  double repetition_penalty = 1.0;          // vLLM's extension: (0, 100]
  double presence_penalty = 0.0;            // [-2, 2]
  double frequency_penalty = 0.0;           // [-2, 2]
  std::vector<std::pair<int32_t, double>> logit_bias;  // token id >= 0 -> [-100, 100] (the vocabulary: the server)
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;            // up to 16 non-empty strings
  bool stream = false;
  bool include_usage = false;               // stream_options.include_usage: a last chunk with usage, no choices
  bool echo = false;                        // completions: the text starts with the prompt
  std::optional<bool> enable_thinking;      // chat_template_kwargs.enable_thinking (Qwen3's switch)
};

// Throws ApiError(400, ...) naming the field for: a body that is not JSON or not an object, a field that is not
// in the request schema (docs/SERVING.md lists every field), a field the server refuses (n != 1, logprobs,
// tools, a response_format other than text, ...), a field of the wrong type, a value out of range, a missing
// prompt/messages.
CompletionRequest parse_completion_request(std::string_view body, Endpoint endpoint);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// Identity of one response: "cmpl-..."/"chatcmpl-..." id, creation time (Unix seconds), model name, and
// whether the stream ends with a usage chunk (stream_options.include_usage: then every chunk has "usage": null
// but that last one).
struct ResponseInfo {
  Endpoint endpoint = Endpoint::completions;
  std::string id;
  int64_t created = 0;
  std::string model;
  bool include_usage = false;
};

// A whole (stream false) response: text_completion or chat.completion.
std::string completion_body(const ResponseInfo& info, const std::string& text, const std::string& finish_reason,
                            const Usage& usage);
// One streamed chunk (text_completion or chat.completion.chunk), without the "data: " framing. role: chat's
// first chunk; finish_reason: the last one with choices.
std::string chunk_body(const ResponseInfo& info, const std::string& text, bool role = false,
                       const std::optional<std::string>& finish_reason = std::nullopt);
// The stream's usage chunk (include_usage): no choices, the request's usage.
std::string usage_chunk_body(const ResponseInfo& info, const Usage& usage);
// GET /v1/models (the list) and GET /v1/models/{id} (one model).
std::string models_body(const std::string& model, int64_t created);
std::string model_body(const std::string& model, int64_t created);

}  // namespace microllm::serve
