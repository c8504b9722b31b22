// The OpenAI request parser and response builders, without sockets: good requests of both endpoints, and
// every error path (a 400 naming the field).
#include "serve/openai_api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

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
      "presence_penalty": 0.5, "frequency_penalty": -0.5, "n": 1, "echo": false, "logprobs": null,
      "stream_options": {"include_usage": true}, "user": "ignored"})");
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
  EXPECT_DOUBLE_EQ(r.presence_penalty, 0.5);
  EXPECT_DOUBLE_EQ(r.frequency_penalty, -0.5);
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
      {R"({"prompt": "x", "echo": true})", "echo"},
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
      {R"({"prompt": "x"})", "messages"},
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
  json last = json::parse(chunk_body(info, "", false, std::string("stop"), Usage{2, 4}));
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(last["usage"]["completion_tokens"], 4);
  // Bytes that are not UTF-8 (a byte-level model) do not break the JSON.
  EXPECT_NO_THROW(json::parse(chunk_body(info, std::string("\xe2\x82", 2))));

  const json models = json::parse(models_body("tiny", 5));
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["object"], "model");
}

}  // namespace
}  // namespace microllm::serve
