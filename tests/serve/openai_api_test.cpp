// The OpenAI request parser and response builders, without sockets: good requests of both endpoints, and
// every error path (a 400 naming the field).
#include "serve/openai_api.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace microllm::serve {
namespace {

using nlohmann::json;

CompletionRequest completion(const std::string& body) { return parse_completion_request(body, Endpoint::completions); }
CompletionRequest chat(const std::string& body) { return parse_completion_request(body, Endpoint::chat_completions); }

// The error a body gets: its param and code (the status is always 400 here).
ApiError error_of(const std::string& body, Endpoint endpoint = Endpoint::completions) {
  try {
    parse_completion_request(body, endpoint);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.type, "invalid_request_error") << body;
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "");
}

TEST(OpenAiApi, CompletionWithEveryField) {
  const CompletionRequest r = completion(R"({"model": "m", "prompt": "Once upon", "max_tokens": 12,
      "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 7, "stop": ["\n", "END"], "stream": true,
      "presence_penalty": 0.5, "frequency_penalty": -0.5, "n": 1, "echo": true, "logprobs": null,
      "stream_options": {"include_usage": true}, "user": "someone", "min_p": 0.05, "repetition_penalty": 1.3,
      "logit_bias": {"17": -100, "3": 2.5}, "best_of": 1, "suffix": ""})");
  EXPECT_EQ(r.endpoint, Endpoint::completions);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt, "Once upon");
  EXPECT_FALSE(r.prompt_ids.has_value());
  EXPECT_EQ(r.max_tokens, 12);
  EXPECT_DOUBLE_EQ(r.temperature, 0.5);
  EXPECT_DOUBLE_EQ(r.top_p, 0.9);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_EQ(r.seed, 7u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.echo);
  EXPECT_DOUBLE_EQ(r.presence_penalty, 0.5);
  EXPECT_DOUBLE_EQ(r.frequency_penalty, -0.5);
  EXPECT_DOUBLE_EQ(r.min_p, 0.05);
  EXPECT_DOUBLE_EQ(r.repetition_penalty, 1.3);
  EXPECT_EQ(r.logit_bias, (std::vector<std::pair<int32_t, double>>{{17, -100.0}, {3, 2.5}}));
}

TEST(OpenAiApi, CompletionDefaultsAndPromptForms) {
  const CompletionRequest r = completion(R"({"prompt": "x"})");
  EXPECT_EQ(r.model, "");
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_DOUBLE_EQ(r.temperature, 1.0);
  EXPECT_DOUBLE_EQ(r.top_p, 1.0);
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(completion(R"({"prompt": ["one string"]})").prompt, "one string");
  EXPECT_EQ(completion(R"({"prompt": [1, 2, 3]})").prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(completion(R"({"prompt": [[4, 5]]})").prompt_ids, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(completion(R"({"prompt": "", "stop": "a", "max_tokens": null, "temperature": 0})").stop,
            std::vector<std::string>{"a"});
  EXPECT_EQ(completion(R"({"prompt": "x", "seed": -1})").seed, static_cast<uint64_t>(-1));
  EXPECT_EQ(completion(R"({"prompt": "x", "top_k": -1})").top_k, 0);
}

TEST(OpenAiApi, ChatMessages) {
  const CompletionRequest r = chat(R"({"model": "m", "messages": [
      {"role": "system", "content": "Be brief."}, {"role": "developer", "content": "Really."},
      {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null}, {"role": "tool", "content": "42"}],
      "max_completion_tokens": 5, "stream": false})");
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].role, "system");
  EXPECT_EQ(r.messages[2].content, "Hi there");
  EXPECT_EQ(r.messages[3].content, "");
  EXPECT_EQ(r.messages[4].role, "tool");
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(chat(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "max_completion_tokens": 9})")
                .max_tokens,
            3);
}

TEST(OpenAiApi, MalformedBodies) {
  // A number past a double's range is the JSON library's out_of_range, not a parse_error (openai_request_fuzz).
  for (const char* body : {"", "{", "not json", "{\"prompt\": \"x\",}", "{\"prompt\": \"\xff\"}",
                           "{\"prompt\": \"x\", \"temperature\": 1e309}"}) {
    const ApiError e = error_of(body);
    EXPECT_EQ(e.code, "invalid_json") << body;
  }
  for (const char* body : {"[]", "\"text\"", "42", "null"}) EXPECT_EQ(error_of(body).param, "") << body;
}

TEST(OpenAiApi, WrongTypesAndValuesNameTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompt": "x", "max_tokens": "ten"})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 1.5})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": -3})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 99999999999999999999})", "max_tokens"},
      {R"({"prompt": "x", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "x", "temperature": 2.5})", "temperature"},
      {R"({"prompt": "x", "temperature": -0.1})", "temperature"},
      {R"({"prompt": "x", "top_p": 0})", "top_p"},
      {R"({"prompt": "x", "top_p": 1.5})", "top_p"},
      {R"({"prompt": "x", "top_p": true})", "top_p"},
      {R"({"prompt": "x", "top_k": -2})", "top_k"},
      {R"({"prompt": "x", "top_k": 0.5})", "top_k"},
      {R"({"prompt": "x", "presence_penalty": 3})", "presence_penalty"},
      {R"({"prompt": "x", "frequency_penalty": "a"})", "frequency_penalty"},
      {R"({"prompt": "x", "seed": "7"})", "seed"},
      {R"({"prompt": "x", "seed": 1.5})", "seed"},
      {R"({"prompt": "x", "stop": 3})", "stop"},
      {R"({"prompt": "x", "stop": ["a", 3]})", "stop"},
      {R"({"prompt": "x", "stop": [""]})", "stop"},
      {R"({"prompt": "x", "stop": ["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]})", "stop"},
      {R"({"prompt": "x", "stream": "yes"})", "stream"},
      {R"({"prompt": "x", "stream": 1})", "stream"},
      {R"({"prompt": "x", "n": 2})", "n"},
      {R"({"prompt": "x", "echo": 1})", "echo"},
      {R"({"prompt": "x", "min_p": 1})", "min_p"},
      {R"({"prompt": "x", "min_p": -0.1})", "min_p"},
      {R"({"prompt": "x", "repetition_penalty": 0})", "repetition_penalty"},
      {R"({"prompt": "x", "repetition_penalty": "2"})", "repetition_penalty"},
      {R"({"prompt": "x", "logit_bias": [1]})", "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"a": 1}})", "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"-1": 1}})", "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"1": 101}})", "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"1": "1"}})", "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"99999999999": 1}})", "logit_bias"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}})", "stream_options.include_usage"},
      {R"({"prompt": "x", "stream": true, "stream_options": {"continuous_usage_stats": true}})",
       "stream_options.continuous_usage_stats"},
      {R"({"prompt": "x", "user": 5})", "user"},
      {R"({"prompt": "x", "logprobs": 5})", "logprobs"},
      {R"({"prompt": "x", "model": 5})", "model"},
      {R"({})", "prompt"},
      {R"({"prompt": null})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": []})", "prompt"},
      {R"({"prompt": ["a", "b"]})", "prompt"},
      {R"({"prompt": [1, -2]})", "prompt"},
      {R"({"prompt": [1, "a"]})", "prompt"},
      {R"({"prompt": [{"a": 1}]})", "prompt"},
  };
  for (const auto& [body, param] : cases) EXPECT_EQ(error_of(body).param, param) << body;
}

TEST(OpenAiApi, ChatErrorsNameTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompt": "x"})", "prompt"},
      {R"({"model": "m"})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": ["hi"]})", "messages[0]"},
      {R"({"messages": [{"content": "hi"}]})", "messages[0].role"},
      {R"({"messages": [{"role": 1, "content": "hi"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": "a"}, {"role": "wizard", "content": "hi"}]})", "messages[1].role"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
       "messages[0].content"},
      // A part whose type is not a string (the JSON library's type_error through value("type", "") before).
      {R"({"messages": [{"role": "user", "content": [{"type": 5, "text": "x"}]}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": ["text"]}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": "5"})", "max_completion_tokens"},
      {R"({"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}]})",
       "messages[0].tool_calls"},
      {R"({"messages": [{"role": "user", "content": "x", "audio": {}}]})", "messages[0].audio"},
      {R"({"messages": [{"role": "user", "content": "x", "reasoning_content": "y"}]})", "messages[0].reasoning_content"},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": 1}})",
       "chat_template_kwargs.enable_thinking"},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"tools": []}})",
       "chat_template_kwargs.tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": "json"})", "response_format"},
  };
  for (const auto& [body, param] : cases) EXPECT_EQ(error_of(body, Endpoint::chat_completions).param, param) << body;
}

TEST(OpenAiApi, ErrorBodyIsAnOpenAiErrorObject) {
  const json e = json::parse(error_body(ApiError(413, "too big", "invalid_request_error", "", "request_too_large")));
  EXPECT_EQ(e["error"]["message"], "too big");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(e["error"]["param"].is_null());
  EXPECT_EQ(e["error"]["code"], "request_too_large");
  const json f = json::parse(error_body(ApiError(400, "bad", "invalid_request_error", "max_tokens")));
  EXPECT_EQ(f["error"]["param"], "max_tokens");
  EXPECT_TRUE(f["error"]["code"].is_null());
}

TEST(OpenAiApi, ResponseBodies) {
  ResponseInfo info{Endpoint::completions, "cmpl-1", 123, "tiny"};
  json c = json::parse(completion_body(info, "abc", "length", {5, 3}));
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "abc");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(c["usage"]["total_tokens"], 8);
  json chunk = json::parse(chunk_body(info, "a"));
  EXPECT_EQ(chunk["choices"][0]["text"], "a");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(chunk.contains("usage"));

  info.endpoint = Endpoint::chat_completions;
  c = json::parse(completion_body(info, "hi", "stop", {2, 1}));
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(c["choices"][0]["message"]["content"], "hi");
  json first = json::parse(chunk_body(info, "", /*role=*/true));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  json last = json::parse(chunk_body(info, "", false, std::string("stop")));
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(last.contains("usage"));
  // Bytes that are not UTF-8 (a byte-level model) do not break the JSON.
  EXPECT_NO_THROW(json::parse(chunk_body(info, std::string("\xe2\x82", 2))));

  // stream_options.include_usage: "usage": null on every chunk, then one with the usage and no choices.
  info.include_usage = true;
  EXPECT_TRUE(json::parse(chunk_body(info, "a")).at("usage").is_null());
  const json usage = json::parse(usage_chunk_body(info, Usage{2, 4}));
  EXPECT_EQ(usage["object"], "chat.completion.chunk");
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"], (json{{"prompt_tokens", 2}, {"completion_tokens", 4}, {"total_tokens", 6}}));

  const json models = json::parse(models_body("tiny", 5));
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["object"], "model");
  EXPECT_EQ(json::parse(model_body("tiny", 5)), models["data"][0]);
}

}  // namespace
}  // namespace microllm::serve

namespace microllm::serve {
namespace {

// ---- The request schema, walked field by field against docs/SERVING.md's table ----

// A field as docs/SERVING.md's "Request fields" table lists it.
struct DocumentedField {
  std::string endpoints;  // both, completions, chat
  std::string state;      // honoured, refused (400)
};

// The cells of a Markdown table row "| a | b | c |", trimmed; empty when the line is not a row.
std::vector<std::string> table_cells(const std::string& line) {
  std::vector<std::string> cells;
  if (line.empty() || line.front() != '|') return cells;
  std::size_t start = 1;
  for (std::size_t bar = line.find('|', start); bar != std::string::npos; bar = line.find('|', start)) {
    std::string cell = line.substr(start, bar - start);
    const auto first = cell.find_first_not_of(' ');
    const auto last = cell.find_last_not_of(' ');
    cells.push_back(first == std::string::npos ? "" : cell.substr(first, last - first + 1));
    start = bar + 1;
  }
  return cells;
}

// The rows of the table that follows `heading` in docs/SERVING.md: | `name` | endpoints | state | notes |.
std::map<std::string, DocumentedField> documented_fields(const std::string& heading) {
  std::ifstream in(std::filesystem::path(MICROLLM_SOURCE_DIR) / "docs" / "SERVING.md");
  EXPECT_TRUE(in.good()) << "cannot read docs/SERVING.md";
  std::map<std::string, DocumentedField> out;
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line.rfind("#", 0) == 0) inside = line == heading;
    const auto cells = table_cells(line);
    if (!inside || cells.size() < 4) continue;
    const std::string& name = cells[0];
    const bool is_field = name.size() > 2 && name.front() == '`' && name.back() == '`';
    if (is_field && (cells[2] == "honoured" || cells[2] == "refused (400)"))
      out[name.substr(1, name.size() - 2)] = {cells[1], cells[2]};
  }
  EXPECT_FALSE(out.empty()) << "no table under '" << heading << "' in docs/SERVING.md";
  return out;
}

// For each field: a value the server honours (for a refused field: its "off" value, which is accepted), and for a
// refused field a value it refuses.
struct FieldSample {
  json accepted;
  json refused = nullptr;
};

const std::map<std::string, FieldSample>& field_samples() {
  static const std::map<std::string, FieldSample> samples = {
      {"model", {"m"}},
      {"prompt", {"Once"}},
      {"messages", {json::array({{{"role", "user"}, {"content", "Hi"}}})}},
      {"max_tokens", {5}},
      {"max_completion_tokens", {5}},
      {"temperature", {0.3}},
      {"top_p", {0.5}},
      {"top_k", {3}},
      {"min_p", {0.1}},
      {"repetition_penalty", {1.2}},
      {"presence_penalty", {0.5}},
      {"frequency_penalty", {0.5}},
      {"logit_bias", {{{"5", -100}}}},
      {"seed", {11}},
      {"stop", {"\n"}},
      {"stream", {true}},
      {"stream_options", {{{"include_usage", true}}}},
      {"echo", {true}},
      {"user", {"u-1"}},
      {"chat_template_kwargs", {{{"enable_thinking", false}}}},
      {"parallel_tool_calls", {false}},
      {"n", {1, 2}},
      {"best_of", {1, 3}},
      {"suffix", {"", "tail"}},
      {"logprobs", {false, 2}},
      {"top_logprobs", {nullptr, 2}},
      {"response_format", {{{"type", "text"}}, {{"type", "json_object"}}}},
      {"tools", {json::array(), json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})}},
      {"functions", {json::array(), json::array({{{"name", "f"}}})}},
      {"tool_choice", {"none", "required"}},
      {"function_call", {"auto", {{"name", "f"}}}},
  };
  return samples;
}

json minimal_body(Endpoint endpoint) {
  return endpoint == Endpoint::completions ? json{{"prompt", "x"}}
                                           : json{{"messages", json::array({{{"role", "user"}, {"content", "x"}}})}};
}

bool in_endpoints(const std::string& endpoints, Endpoint endpoint) {
  return endpoints == "both" || endpoints == (endpoint == Endpoint::completions ? "completions" : "chat");
}

// The body with `name` set to `value` (stream_options needs stream: true).
std::string body_with(Endpoint endpoint, const std::string& name, const json& value) {
  json body = minimal_body(endpoint);
  body[name] = value;
  if (name == "stream_options") body["stream"] = true;
  return body.dump();
}

std::optional<ApiError> refusal(const std::string& body, Endpoint endpoint) {
  try {
    parse_completion_request(body, endpoint);
  } catch (const ApiError& e) {
    return e;
  }
  return std::nullopt;
}

TEST(OpenAiApi, EveryDocumentedFieldIsHonouredOrRefusedAsTheDocsSay) {
  const std::map<std::string, DocumentedField> docs = documented_fields("## Request fields");
  for (const auto& [name, sample] : field_samples()) {
    EXPECT_TRUE(docs.count(name)) << "'" << name << "' is not in docs/SERVING.md's Request fields";
  }
  for (const auto& [name, doc] : docs) {
    SCOPED_TRACE(name);
    const auto sample = field_samples().find(name);
    ASSERT_NE(sample, field_samples().end()) << "documented but not walked here: add a sample";
    const bool refused_field = doc.state != "honoured";
    EXPECT_EQ(refused_field, !sample->second.refused.is_null()) << "the docs say " << doc.state;
    for (Endpoint endpoint : {Endpoint::completions, Endpoint::chat_completions}) {
      if (name == "prompt" || name == "messages") continue;  // the minimal bodies' own fields
      SCOPED_TRACE(endpoint_path(endpoint));
      const std::optional<ApiError> accepted = refusal(body_with(endpoint, name, sample->second.accepted), endpoint);
      if (!in_endpoints(doc.endpoints, endpoint)) {
        ASSERT_TRUE(accepted) << "accepted outside its endpoints (" << doc.endpoints << ")";
        EXPECT_EQ(accepted->param, name);
        EXPECT_EQ(accepted->code, "unknown_parameter");
        continue;
      }
      EXPECT_FALSE(accepted) << accepted->what();
      if (!refused_field) continue;
      const std::optional<ApiError> refused = refusal(body_with(endpoint, name, sample->second.refused), endpoint);
      ASSERT_TRUE(refused) << sample->second.refused.dump() << " accepted";
      EXPECT_EQ(refused->status, 400);
      EXPECT_EQ(refused->param, name);
      EXPECT_EQ(refused->code, "unsupported_parameter") << refused->what();
    }
  }
}

// Fields of OpenAI's and vLLM's schemas that the server does not know, and made-up ones: 400, naming them.
TEST(OpenAiApi, UnknownFieldsAreRefusedByName) {
  for (const char* name : {"audio", "modalities", "metadata", "store", "service_tier", "prediction",
                           "reasoning_effort", "web_search_options", "ignore_eos", "min_tokens", "stop_token_ids",
                           "guided_json", "skip_special_tokens", "temprature", "Temperature", ""}) {
    for (Endpoint endpoint : {Endpoint::completions, Endpoint::chat_completions}) {
      const std::optional<ApiError> e = refusal(body_with(endpoint, name, 1), endpoint);
      ASSERT_TRUE(e) << name;
      EXPECT_EQ(e->status, 400);
      EXPECT_EQ(e->param, name);
      EXPECT_EQ(e->code, "unknown_parameter");
      EXPECT_NE(std::string(e->what()).find(std::string("Unrecognized request argument supplied: ") + name),
                std::string::npos)
          << e->what();
    }
  }
}

TEST(OpenAiApi, EveryDocumentedMessageFieldIsHonouredOrRefused) {
  const std::map<std::string, DocumentedField> docs = documented_fields("## Message fields");
  const std::map<std::string, std::pair<json, json>> samples = {  // (an accepted message, a refused one)
      {"role", {{{"role", "user"}}, nullptr}},
      {"content", {{{"role", "user"}, {"content", "x"}}, nullptr}},
      {"name", {{{"role", "user"}, {"content", "x"}, {"name", "ann"}}, nullptr}},
      {"tool_call_id", {{{"role", "tool"}, {"content", "4"}, {"tool_call_id", "c1"}}, nullptr}},
      {"reasoning_content", {{{"role", "assistant"}, {"content", "4"}, {"reasoning_content", "2+2"}}, nullptr}},
      {"tool_calls",
       {{{"role", "assistant"}, {"content", "x"}, {"tool_calls", json::array()}},
        {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array({{{"id", "c1"}}})}}}},
  };
  EXPECT_EQ(docs.size(), samples.size());
  for (const auto& [name, doc] : docs) {
    SCOPED_TRACE(name);
    const auto sample = samples.find(name);
    ASSERT_NE(sample, samples.end()) << "documented but not walked here";
    EXPECT_EQ(doc.endpoints, "chat");
    const json accepted = {{"messages", json::array({sample->second.first})}};
    EXPECT_FALSE(refusal(accepted.dump(), Endpoint::chat_completions));
    EXPECT_EQ(doc.state == "honoured", sample->second.second.is_null());
    if (sample->second.second.is_null()) continue;
    const json refused = {{"messages", json::array({sample->second.second})}};
    const std::optional<ApiError> e = refusal(refused.dump(), Endpoint::chat_completions);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->param, "messages[0]." + name);
  }
}

}  // namespace
}  // namespace microllm::serve
