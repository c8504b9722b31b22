#include "serve/openai_api.h"

#include <algorithm>
#include <cmath>
#include <iterator>
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

// A message's fields: role and content, Qwen3's reasoning_content, and the OpenAI fields the supported chat
// templates do not read (name, tool_call_id: transformers passes them to a template that ignores them too).
// tool_calls would need a template that renders them: refused.
void check_message_fields(const json& m, const std::string& at) {
  for (const auto& [key, value] : m.items()) {
    if (key == "role" || key == "content" || key == "name" || key == "tool_call_id" || key == "reasoning_content") {
      continue;
    }
    if (key == "tool_calls" && (value.is_null() || (value.is_array() && value.empty()))) continue;
    throw bad(at + "." + key, "'" + at + "." + key + "' is not supported by this server");
  }
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
    check_message_fields(m, at);
    ChatMessage message{name, message_content(m, i)};
    if (const json* reasoning = field(m, "reasoning_content")) {
      if (!reasoning->is_string() || name != "assistant") {
        throw bad(at + ".reasoning_content", "'" + at + ".reasoning_content' must be a string of an assistant message");
      }
      message.reasoning_content = reasoning->get<std::string>();
    }
    r.messages.push_back(std::move(message));
  }
}

// ---- The request schema: every field a body may have ----

enum class Scope { both, completions, chat };

// Fields the server honours (parsed below). A body's other fields are refused: kRefused names the known
// OpenAI / vLLM fields it does not implement (accepted only at their "off" values); anything else is unknown.
struct Field {
  std::string_view name;
  Scope scope;
};
constexpr Field kHonoured[] = {
    {"model", Scope::both},           {"prompt", Scope::completions},     {"messages", Scope::chat},
    {"max_tokens", Scope::both},      {"max_completion_tokens", Scope::chat}, {"temperature", Scope::both},
    {"top_p", Scope::both},           {"top_k", Scope::both},             {"min_p", Scope::both},
    {"repetition_penalty", Scope::both}, {"presence_penalty", Scope::both}, {"frequency_penalty", Scope::both},
    {"logit_bias", Scope::both},      {"seed", Scope::both},              {"stop", Scope::both},
    {"stream", Scope::both},          {"stream_options", Scope::both},    {"echo", Scope::completions},
    {"user", Scope::both},            {"chat_template_kwargs", Scope::chat},
    // Accepted at the value that means "off" only (refuse_unsupported):
    {"n", Scope::both},               {"best_of", Scope::completions},    {"suffix", Scope::completions},
    {"logprobs", Scope::both},        {"top_logprobs", Scope::chat},      {"response_format", Scope::chat},
    {"tools", Scope::chat},           {"tool_choice", Scope::chat},       {"parallel_tool_calls", Scope::chat},
    {"functions", Scope::chat},       {"function_call", Scope::chat},
};

bool in_scope(Scope scope, Endpoint endpoint) {
  return scope == Scope::both || (scope == Scope::completions) == (endpoint == Endpoint::completions);
}

void refuse_unknown_fields(const json& body, Endpoint endpoint) {
  for (const auto& [key, value] : body.items()) {
    const bool known = std::any_of(std::begin(kHonoured), std::end(kHonoured),
                                   [&](const Field& f) { return f.name == key && in_scope(f.scope, endpoint); });
    if (!known) {
      throw ApiError(400, "Unrecognized request argument supplied: " + key + " (" + endpoint_path(endpoint) +
                              " takes the fields docs/SERVING.md lists)",
                     "invalid_request_error", key, "unknown_parameter");
    }
  }
}

ApiError unsupported(const std::string& name, const std::string& what) {
  return bad(name, "'" + name + "' " + what + " is not supported by this server", "unsupported_parameter");
}

bool is_empty_array(const json& v) { return v.is_array() && v.empty(); }

// The fields accepted only at the value that means "off": one completion, no log probabilities, plain text, no
// tools.
void refuse_unsupported(const json& body, Endpoint endpoint) {
  if (const json* n = field(body, "n"); n && integer(*n, "n") != 1) throw unsupported("n", "other than 1");
  if (const json* b = field(body, "best_of"); b && integer(*b, "best_of") != 1) {
    throw unsupported("best_of", "other than 1");
  }
  if (const json* s = field(body, "suffix"); s && !(s->is_string() && s->get<std::string>().empty())) {
    throw unsupported("suffix", "(text after the completion)");
  }
  if (const json* l = field(body, "logprobs"); l && !(l->is_boolean() && !l->get<bool>())) {
    throw unsupported("logprobs", "(log probabilities)");
  }
  if (field(body, "top_logprobs")) throw unsupported("top_logprobs", "(log probabilities)");
  if (endpoint == Endpoint::completions) return;
  if (const json* f = field(body, "response_format")) {
    const auto type = f->is_object() ? f->find("type") : f->end();
    if (!f->is_object() || type == f->end() || !type->is_string()) {
      throw bad("response_format", "'response_format' must be an object with a string 'type'");
    }
    if (*type != "text" || f->size() != 1) throw unsupported("response_format", "of type " + type->dump());
  }
  for (const char* tools : {"tools", "functions"}) {
    if (const json* t = field(body, tools); t && !is_empty_array(*t)) throw unsupported(tools, "(tool calling)");
  }
  for (const char* choice : {"tool_choice", "function_call"}) {
    if (const json* c = field(body, choice); c && !(*c == "none" || *c == "auto")) {
      throw unsupported(choice, "other than \"none\" or \"auto\" without tools");
    }
  }
  if (const json* p = field(body, "parallel_tool_calls"); p && !p->is_boolean()) {
    throw bad("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
  }
}

// OpenAI's logit_bias: {"token id": bias in [-100, 100]}.
std::vector<std::pair<int32_t, double>> parse_logit_bias(const json& v) {
  if (!v.is_object()) throw bad("logit_bias", std::string("'logit_bias' must be an object, got ") + v.type_name());
  std::vector<std::pair<int32_t, double>> out;
  for (const auto& [key, value] : v.items()) {
    const bool digits = !key.empty() && key.size() <= 10 &&
                        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    const int64_t id = digits ? std::stoll(key) : -1;
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
      throw bad("logit_bias", "'logit_bias' keys must be token ids (non-negative integers), got \"" + key + "\"");
    }
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < -100 ||
        value.get<double>() > 100) {
      throw bad("logit_bias", "'logit_bias' values must be numbers in [-100, 100], got " + value.dump() +
                                  " for token " + key);
    }
    out.emplace_back(static_cast<int32_t>(id), value.get<double>());
  }
  return out;
}

void parse_stream_options(const json& body, CompletionRequest& r) {
  const json* o = field(body, "stream_options");
  if (!o) return;
  if (!r.stream) throw bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
  if (!o->is_object()) throw bad("stream_options", "'stream_options' must be an object");
  for (const auto& [key, value] : o->items()) {
    if (key != "include_usage") throw unsupported("stream_options." + key, "");
    if (!value.is_null() && !value.is_boolean()) {
      throw bad("stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
    }
    r.include_usage = value.is_boolean() && value.get<bool>();
  }
}

// vLLM's chat_template_kwargs: the template's extra variables; the built-in templates take enable_thinking.
void parse_template_kwargs(const json& body, CompletionRequest& r) {
  const json* k = field(body, "chat_template_kwargs");
  if (!k) return;
  if (!k->is_object()) throw bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
  for (const auto& [key, value] : k->items()) {
    if (key != "enable_thinking") throw unsupported("chat_template_kwargs." + key, "");
    if (!value.is_boolean()) {
      throw bad("chat_template_kwargs.enable_thinking", "'chat_template_kwargs.enable_thinking' must be a boolean");
    }
    r.enable_thinking = value.get<bool>();
  }
}

bool boolean_field(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return false;
  if (!v->is_boolean()) throw bad(name, std::string("'") + name + "' must be a boolean, got " + v->type_name());
  return v->get<bool>();
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
  refuse_unknown_fields(body, endpoint);
  CompletionRequest r;
  r.endpoint = endpoint;
  r.model = string_field(body, "model");
  string_field(body, "user");  // a string when present; it changes nothing in the answer
  if (endpoint == Endpoint::completions) parse_prompt(body, r);
  else parse_messages(body, r);
  refuse_unsupported(body, endpoint);

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
  r.min_p = number_in(body, "min_p", 0.0, 0.0, 1.0);
  if (r.min_p == 1.0) throw bad("min_p", "'min_p' must be in [0, 1), got 1");
  r.repetition_penalty = number_in(body, "repetition_penalty", 1.0, 0.0, 100.0, /*low_open=*/true);
  r.presence_penalty = number_in(body, "presence_penalty", 0.0, -2.0, 2.0);
  r.frequency_penalty = number_in(body, "frequency_penalty", 0.0, -2.0, 2.0);
  if (const json* b = field(body, "logit_bias")) r.logit_bias = parse_logit_bias(*b);
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
  r.stream = boolean_field(body, "stream");
  parse_stream_options(body, r);
  if (endpoint == Endpoint::completions) r.echo = boolean_field(body, "echo");
  else parse_template_kwargs(body, r);
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
                       const std::optional<std::string>& finish_reason) {
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
  if (info.include_usage) body["usage"] = nullptr;
  return dump(body);
}

std::string usage_chunk_body(const ResponseInfo& info, const Usage& usage) {
  const bool chat = info.endpoint == Endpoint::chat_completions;
  return dump(json{{"id", info.id},
                   {"object", chat ? "chat.completion.chunk" : "text_completion"},
                   {"created", info.created},
                   {"model", info.model},
                   {"choices", json::array()},
                   {"usage",
                    {{"prompt_tokens", usage.prompt_tokens},
                     {"completion_tokens", usage.completion_tokens},
                     {"total_tokens", usage.prompt_tokens + usage.completion_tokens}}}});
}

std::string model_body(const std::string& model, int64_t created) {
  return dump(json{{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "microllm"}});
}

std::string models_body(const std::string& model, int64_t created) {
  return dump(json{{"object", "list"}, {"data", json::array({json::parse(model_body(model, created))})}});
}

}  // namespace microllm::serve
