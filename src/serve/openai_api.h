// The OpenAI wire format, without sockets: parsing and validating /v1/completions and /v1/chat/completions
// request bodies, and building the JSON of responses, stream chunks, errors and /v1/models.
// Private to the serve layer (tests include it through src/).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
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
  int64_t top_k = 0;                        // an extension (vLLM's): 0 or -1: off
  double presence_penalty = 0.0;            // [-2, 2]
  double frequency_penalty = 0.0;           // [-2, 2]
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;            // up to 16 non-empty strings
  bool stream = false;
};

// Throws ApiError(400, ...) naming the field for: a body that is not JSON or not an object, a field of the
// wrong type, a value out of range, a missing prompt/messages, n != 1, echo, and logprobs.
CompletionRequest parse_completion_request(std::string_view body, Endpoint endpoint);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// Identity of one response: "cmpl-..."/"chatcmpl-..." id, creation time (Unix seconds), model name.
struct ResponseInfo {
  Endpoint endpoint = Endpoint::completions;
  std::string id;
  int64_t created = 0;
  std::string model;
};

// A whole (stream false) response: text_completion or chat.completion.
std::string completion_body(const ResponseInfo& info, const std::string& text, const std::string& finish_reason,
                            const Usage& usage);
// One streamed chunk (text_completion or chat.completion.chunk), without the "data: " framing. role: chat's
// first chunk; finish_reason and usage: the last one.
std::string chunk_body(const ResponseInfo& info, const std::string& text, bool role = false,
                       const std::optional<std::string>& finish_reason = std::nullopt,
                       const std::optional<Usage>& usage = std::nullopt);
// GET /v1/models.
std::string models_body(const std::string& model, int64_t created);

}  // namespace microllm::serve
