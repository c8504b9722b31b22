#include "serve/openai_api.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/json_text.h"

namespace microllm::serve {

using nlohmann::json;

namespace {

// Strings from the model may hold bytes that are not UTF-8 (a byte-level model): they become U+FFFD.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

ApiError bad(const std::string& param, const std::string& message, const std::string& code = "") {
  return ApiError(400, message, "invalid_request_error", param, code);
}

const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

double number_in(const json& body, const char* name, double fallback, double low, double high, bool low_open = false) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number()) throw bad(name, std::string("'") + name + "' must be a number, got " + v->type_name());
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < low || x > high || (low_open && x == low)) {
    throw bad(name, std::string("'") + name + "' must be in " + (low_open ? "(" : "[") + json(low).dump() + ", " +
                        json(high).dump() + "], got " + v->dump());
  }
  return x;
}

int64_t integer(const json& v, const char* name) {
  if (!v.is_number_integer()) throw bad(name, std::string("'") + name + "' must be an integer, got " + v.type_name());
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    throw bad(name, std::string("'") + name + "' is too large");
  }
  return v.get<int64_t>();
}

std::string string_field(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return {};
  if (!v->is_string()) throw bad(name, std::string("'") + name + "' must be a string, got " + v->type_name());
  return v->get<std::string>();
}

std::vector<int32_t> token_ids(const json& array) {
  std::vector<int32_t> ids;
  for (const json& v : array) {
    if (!v.is_number_integer() || integer(v, "prompt") < 0 || v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      throw bad("prompt", "'prompt' token ids must be non-negative integers");
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

void parse_prompt(const json& body, CompletionRequest& r) {
  const json* p = field(body, "prompt");
  if (!p) throw bad("prompt", "'prompt' is required");
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
    return;
  }
  if (p->is_array()) {
    if (p->empty()) throw bad("prompt", "'prompt' is an empty array");
    if (p->size() == 1 && (*p)[0].is_string()) {
      r.prompt = (*p)[0].get<std::string>();
      return;
    }
    if ((*p)[0].is_number()) {
      r.prompt_ids = token_ids(*p);
      return;
    }
    if (p->size() == 1 && (*p)[0].is_array() && !(*p)[0].empty()) {
      r.prompt_ids = token_ids((*p)[0]);
      return;
    }
    throw bad("prompt", "'prompt' must be one string or one list of token ids (batched prompts are not supported)");
  }
  throw bad("prompt", std::string("'prompt' must be a string or an array, got ") + p->type_name());
}

std::string message_content(const json& m, size_t i) {
  const std::string param = "messages[" + std::to_string(i) + "].content";
  const auto it = m.find("content");
  if (it == m.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {  // content parts: only text
    std::string text;
    for (const json& part : *it) {
      // find, not value(): value("type", "") throws a type_error when "type" is not a string.
      const auto type = part.find("type"), part_text = part.find("text");  // end() unless part is an object
      if (type == part.end() || *type != "text" || part_text == part.end() || !part_text->is_string()) {
        throw bad(param, "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
      }
      text += part_text->get<std::string>();
    }
    return text;
  }
  throw bad(param, "'" + param + "' must be a string or an array of text parts, got " + it->type_name());
}

void parse_messages(const json& body, CompletionRequest& r) {
  const json* ms = field(body, "messages");
  if (!ms) throw bad("messages", "'messages' is required");
  if (!ms->is_array()) throw bad("messages", std::string("'messages' must be an array, got ") + ms->type_name());
  if (ms->empty()) throw bad("messages", "'messages' is empty");
  for (size_t i = 0; i < ms->size(); ++i) {
    const json& m = (*ms)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad(at, "'" + at + "' must be an object");
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) throw bad(at + ".role", "'" + at + ".role' must be a string");
    std::string name = role->get<std::string>();
    if (name == "developer") name = "system";
    if (name != "system" && name != "user" && name != "assistant" && name != "tool") {
      throw bad(at + ".role", "'" + at + ".role' must be system, developer, user, assistant or tool, got '" + name + "'");
    }
    r.messages.push_back({name, message_content(m, i)});
  }
}

}  // namespace

std::string error_body(const ApiError& error) {
  json e = {{"message", error.what()}, {"type", error.type}, {"param", nullptr}, {"code", nullptr}};
  if (!error.param.empty()) e["param"] = error.param;
  if (!error.code.empty()) e["code"] = error.code;
  return dump(json{{"error", e}});
}

const char* endpoint_path(Endpoint endpoint) {
  return endpoint == Endpoint::completions ? "/v1/completions" : "/v1/chat/completions";
}

CompletionRequest parse_completion_request(std::string_view text, Endpoint endpoint) {
  json body;
  try {
    body = detail::parse_json(text, "", "the request body is not valid JSON");
  } catch (const ParseError& e) {
    throw bad("", e.what(), "invalid_json");
  }
  if (!body.is_object()) throw bad("", std::string("the request body must be a JSON object, got ") + body.type_name());
  CompletionRequest r;
  r.endpoint = endpoint;
  r.model = string_field(body, "model");
  if (endpoint == Endpoint::completions) parse_prompt(body, r);
  else parse_messages(body, r);

  const char* max_name = "max_tokens";
  const json* max = field(body, "max_tokens");
  if (!max && endpoint == Endpoint::chat_completions && (max = field(body, "max_completion_tokens"))) {
    max_name = "max_completion_tokens";
  }
  if (max) {
    const int64_t n = integer(*max, max_name);
    if (n < 1) throw bad(max_name, std::string("'") + max_name + "' must be at least 1, got " + std::to_string(n));
    r.max_tokens = n;
  }
  r.temperature = number_in(body, "temperature", 1.0, 0.0, 2.0);
  r.top_p = number_in(body, "top_p", 1.0, 0.0, 1.0, /*low_open=*/true);
  r.presence_penalty = number_in(body, "presence_penalty", 0.0, -2.0, 2.0);
  r.frequency_penalty = number_in(body, "frequency_penalty", 0.0, -2.0, 2.0);
  if (const json* k = field(body, "top_k")) {
    const int64_t top_k = integer(*k, "top_k");
    if (top_k < -1) throw bad("top_k", "'top_k' must be -1, 0 (off) or positive");
    r.top_k = std::max<int64_t>(top_k, 0);
  }
  if (const json* s = field(body, "seed")) {
    if (!s->is_number_integer()) throw bad("seed", std::string("'seed' must be an integer, got ") + s->type_name());
    r.seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
  if (const json* s = field(body, "stop")) {
    if (s->is_string()) {
      r.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (const json& v : *s) {
        if (!v.is_string()) throw bad("stop", "'stop' must be a string or an array of strings");
        r.stop.push_back(v.get<std::string>());
      }
    } else {
      throw bad("stop", std::string("'stop' must be a string or an array of strings, got ") + s->type_name());
    }
    if (r.stop.size() > 16) throw bad("stop", "'stop' has more than 16 strings");
    for (const std::string& x : r.stop) {
      if (x.empty()) throw bad("stop", "'stop' strings must not be empty");
    }
  }
  if (const json* s = field(body, "stream")) {
    if (!s->is_boolean()) throw bad("stream", std::string("'stream' must be a boolean, got ") + s->type_name());
    r.stream = s->get<bool>();
  }
  if (const json* n = field(body, "n")) {
    if (integer(*n, "n") != 1) throw bad("n", "only n = 1 is supported");
  }
  if (const json* e = field(body, "echo"); e && !(e->is_boolean() && !e->get<bool>())) {
    throw bad("echo", "'echo' is not supported");
  }
  if (const json* l = field(body, "logprobs"); l && !(l->is_boolean() && !l->get<bool>())) {
    throw bad("logprobs", "'logprobs' is not supported");
  }
  return r;
}

std::string completion_body(const ResponseInfo& info, const std::string& text, const std::string& finish_reason,
                            const Usage& usage) {
  const bool chat = info.endpoint == Endpoint::chat_completions;
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  if (chat) choice["message"] = {{"role", "assistant"}, {"content", text}};
  else choice["text"] = text;
  const json body = {{"id", info.id},
                     {"object", chat ? "chat.completion" : "text_completion"},
                     {"created", info.created},
                     {"model", info.model},
                     {"choices", json::array({choice})},
                     {"usage",
                      {{"prompt_tokens", usage.prompt_tokens},
                       {"completion_tokens", usage.completion_tokens},
                       {"total_tokens", usage.prompt_tokens + usage.completion_tokens}}}};
  return dump(body);
}

std::string chunk_body(const ResponseInfo& info, const std::string& text, bool role,
                       const std::optional<std::string>& finish_reason, const std::optional<Usage>& usage) {
  const bool chat = info.endpoint == Endpoint::chat_completions;
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (finish_reason) choice["finish_reason"] = *finish_reason;
  if (chat) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (role || !text.empty() || !finish_reason) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  json body = {{"id", info.id},
               {"object", chat ? "chat.completion.chunk" : "text_completion"},
               {"created", info.created},
               {"model", info.model},
               {"choices", json::array({choice})}};
  if (usage) {
    body["usage"] = {{"prompt_tokens", usage->prompt_tokens},
                     {"completion_tokens", usage->completion_tokens},
                     {"total_tokens", usage->prompt_tokens + usage->completion_tokens}};
  }
  return dump(body);
}

std::string models_body(const std::string& model, int64_t created) {
  return dump(json{{"object", "list"},
                   {"data", json::array({json{{"id", model}, {"object", "model"}, {"created", created},
                                              {"owned_by", "microllm"}}})}});
}

}  // namespace microllm::serve
