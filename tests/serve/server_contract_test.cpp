// What the server promises its clients, over real HTTP on loopback (an in-process server on an ephemeral port,
// and for the port checks the microllm command as a second process): the sampling fields a request may carry
// change the answer exactly as generate() does with the same parameters; echo and stream_options; refused and
// unknown fields get a 400 naming them; /v1/models/{id} and the model name; a non-streaming client that leaves
// frees its row and KV blocks; a shutdown ends a stream with an error event; response ids are random; CORS;
// one server per port, ports within 0-65535.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "cli_testing.h"
#include "microllm/generate/generate.h"
#include "microllm/serve/server.h"
#include "microllm/tokenizer/tokenizer.h"
#include "sse_testing.h"
#include "test_support.h"
#include "tiny_model_dir.h"

namespace microllm::serve {
namespace {

using Clock = std::chrono::steady_clock;

ServerOptions tiny_options(const testing::TinyModelDir& dir) {
  ServerOptions options;
  options.model_dir = dir.dir.string();
  options.model_name = "tiny";
  options.port = 0;
  options.dtype = "f64";  // batched steps equal lone runs exactly (see server_test.cpp)
  return options;
}

httplib::Client client_of(const Server& server) {
  httplib::Client c("127.0.0.1", server.port());
  c.set_read_timeout(60);
  return c;
}

double metric(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return 0;
  return std::stod(text.substr(at + name.size() + 2));
}

// The server's /metrics once no request runs and no KV block is held, or after `seconds` as it is then.
std::string metrics_when_idle(const Server& server, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  std::string m;
  do {
    m = server.metrics_text();
    if (metric(m, "microllm_requests_running") == 0 && metric(m, "microllm_kv_blocks_used") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (Clock::now() < deadline);
  return m;
}

class ServeContractTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<testing::TinyModelDir>(testing::fresh_seed());
    server_ = std::make_unique<Server>(tiny_options(*dir_));
    server_->start();
    model_ = models::load_model(dir_->dir.string(), {.dtype = DType::f64}).model;
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::load(dir_->dir.string()));
  }
  static void TearDownTestSuite() {
    server_.reset();
    model_.reset();
    tokenizer_.reset();
    dir_.reset();
  }

  static httplib::Result post(const json& body, const std::string& path = "/v1/completions") {
    return client_of(*server_).Post(path.c_str(), body.dump(), "application/json");
  }

  // What generate_text gives a completion prompt with these sampling parameters: the server's text must equal it.
  static generate::Generation reference(const std::string& prompt, const generate::SamplingParams& sampling,
                                        int64_t max_tokens) {
    generate::GenerateOptions o;
    o.compute_dtype = DType::f64;
    o.max_new_tokens = max_tokens;
    o.sampling = sampling;
    o.stop_ids = {256, 258};
    auto stream = std::make_shared<StreamDecoder>(tokenizer_->stream_decoder(true));
    generate::TextDecoder decoder{[stream](int32_t id) { return stream->push(id); }, [stream] { return stream->finish(); }};
    return generate::generate_text(*model_, tokenizer_->encode(prompt, true), o, decoder);
  }

  static std::string text_of(const httplib::Result& res) {
    EXPECT_TRUE(res);
    if (!res) return "";
    EXPECT_EQ(res->status, 200) << res->body;
    return res->status == 200 ? json::parse(res->body)["choices"][0]["text"].get<std::string>() : "";
  }

  static std::unique_ptr<testing::TinyModelDir> dir_;
  static std::unique_ptr<Server> server_;
  static std::unique_ptr<nn::TransformerLM> model_;
  static std::unique_ptr<Tokenizer> tokenizer_;
};

std::unique_ptr<testing::TinyModelDir> ServeContractTest::dir_;
std::unique_ptr<Server> ServeContractTest::server_;
std::unique_ptr<nn::TransformerLM> ServeContractTest::model_;
std::unique_ptr<Tokenizer> ServeContractTest::tokenizer_;

// Each sampling field the server takes gives the text generate_text gives with that parameter, and the
// penalties and the bias change the greedy text (a server that ignored them would answer the plain one).
TEST_F(ServeContractTest, SamplingFieldsAnswerAsGenerateDoes) {
  const int64_t n = 24;
  // A random model's greedy run can stop at its first token (a stop id), which no penalty changes: take the
  // first prompt whose greedy run the repetition penalty changes.
  std::string prompt;
  generate::Generation plain;
  for (const char* candidate : {"The tiny model says", "Once upon a time", "A quick brown fox", "1 2 3 4 5"}) {
    plain = reference(candidate, {.temperature = 0}, n);
    if (reference(candidate, {.temperature = 0, .repetition_penalty = 3.0}, n).tokens != plain.tokens) {
      prompt = candidate;
      break;
    }
  }
  ASSERT_FALSE(prompt.empty()) << "no prompt's greedy run changes under a repetition penalty";
  ASSERT_FALSE(plain.tokens.empty());
  const int32_t first = plain.tokens.front();
  struct Case {
    json fields;
    generate::SamplingParams params;
    bool changes_greedy;
  };
  const std::vector<Case> cases = {
      {{{"temperature", 0}, {"repetition_penalty", 3.0}}, {.temperature = 0, .repetition_penalty = 3.0}, true},
      {{{"temperature", 0}, {"logit_bias", {{std::to_string(first), -100}}}},
       {.temperature = 0, .logit_bias = {{first, -100.0}}},
       true},
      {{{"temperature", 0}, {"logit_bias", {{"65", 40}}}}, {.temperature = 0, .logit_bias = {{65, 40.0}}}, true},
      {{{"temperature", 1.0}, {"min_p", 0.3}, {"seed", 7}}, {.temperature = 1.0, .min_p = 0.3, .seed = 7}, false},
      {{{"temperature", 0.9}, {"top_k", 5}, {"top_p", 0.8}, {"presence_penalty", 1.5}, {"frequency_penalty", 0.5},
        {"seed", 3}},
       {.temperature = 0.9, .top_k = 5, .top_p = 0.8, .presence_penalty = 1.5, .frequency_penalty = 0.5, .seed = 3},
       false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fields.dump());
    json body = c.fields;
    body["prompt"] = prompt;
    body["max_tokens"] = n;
    const generate::Generation expected = reference(prompt, c.params, n);
    EXPECT_EQ(text_of(post(body)), expected.text);
    if (c.changes_greedy) {
      EXPECT_NE(expected.tokens, plain.tokens) << "the case does not test the field";
    }
  }
}

TEST_F(ServeContractTest, EchoStartsTheTextWithThePrompt) {
  const std::string prompt = "Echo me";
  const std::string plain = text_of(post({{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}}));
  EXPECT_EQ(text_of(post({{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"echo", true}})), prompt + plain);
  const std::vector<int32_t> ids = tokenizer_->encode(prompt, true);
  EXPECT_EQ(text_of(post({{"prompt", ids}, {"max_tokens", 6}, {"temperature", 0}, {"echo", true}})),
            tokenizer_->decode(ids) + plain);
  auto streamed = post({{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"echo", true}, {"stream", true}});
  ASSERT_TRUE(streamed);
  EXPECT_EQ(parse_sse(streamed->body, false).text, prompt + plain);
}

TEST_F(ServeContractTest, RefusedAndUnknownFieldsNameThemselves) {
  auto expect = [&](const json& body, const std::string& param, const std::string& code, const char* path) {
    auto res = post(body, path);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << res->body;
    const json e = json::parse(res->body)["error"];
    EXPECT_EQ(e["param"], param) << res->body;
    EXPECT_EQ(e["code"], code) << res->body;
  };
  const json messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  expect({{"messages", messages}, {"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})}},
         "tools", "unsupported_parameter", "/v1/chat/completions");
  expect({{"messages", messages}, {"response_format", {{"type", "json_object"}}}}, "response_format",
         "unsupported_parameter", "/v1/chat/completions");
  expect({{"prompt", "x"}, {"best_of", 2}}, "best_of", "unsupported_parameter", "/v1/completions");
  expect({{"prompt", "x"}, {"suffix", "end"}}, "suffix", "unsupported_parameter", "/v1/completions");
  expect({{"prompt", "x"}, {"temprature", 0}}, "temprature", "unknown_parameter", "/v1/completions");
  auto outside = post({{"prompt", "x"}, {"logit_bias", {{"100000", 5}}}});
  ASSERT_TRUE(outside);
  EXPECT_EQ(outside->status, 400);
  EXPECT_EQ(json::parse(outside->body)["error"]["param"], "logit_bias") << outside->body;
}

TEST_F(ServeContractTest, ModelsByIdAndTheModelName) {
  httplib::Client c = client_of(*server_);
  auto one = c.Get("/v1/models/tiny");
  ASSERT_TRUE(one);
  ASSERT_EQ(one->status, 200) << one->body;
  EXPECT_EQ(json::parse(one->body)["id"], "tiny");
  EXPECT_EQ(json::parse(one->body)["object"], "model");
  auto other = c.Get("/v1/models/gpt-4o");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  EXPECT_EQ(json::parse(other->body)["error"]["code"], "model_not_found");
  auto wrong = post({{"model", "gpt-4o"}, {"prompt", "x"}, {"max_tokens", 2}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 404);
  EXPECT_EQ(json::parse(wrong->body)["error"]["param"], "model");
  auto right = post({{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 2}});
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200);
  EXPECT_EQ(json::parse(right->body)["model"], "tiny");
}

// A long request the tiny model cannot end early: the end-of-sequence ids are biased away.
json endless(int64_t max_tokens, bool stream) {
  return {{"prompt", "Tell me everything"}, {"max_tokens", max_tokens}, {"temperature", 0.8},
          {"logit_bias", {{"256", -100}, {"258", -100}}}, {"stream", stream}};
}

// A non-streaming client that gives up (curl -m) must not leave its request generating: the server notices the
// closed connection, cancels the request and gives back its row and KV blocks.
TEST(ServeDisconnect, NonStreamingClientThatLeavesFreesItsRowAndBlocks) {
  const testing::TinyModelDir dir(testing::fresh_seed(), /*window=*/16384);
  Server server(tiny_options(dir));
  server.start();
  const int64_t max_tokens = 16000;
  {
    httplib::Client c("127.0.0.1", server.port());
    c.set_read_timeout(0, 300 * 1000);  // 0.3 s, then the client closes the connection
    auto res = c.Post("/v1/completions", endless(max_tokens, false).dump(), "application/json");
    EXPECT_FALSE(res) << "the request finished within 0.3 s: the test cannot tell";
  }
  const auto left = Clock::now();
  const std::string m = metrics_when_idle(server, 20);
  const double seconds = std::chrono::duration<double>(Clock::now() - left).count();
  EXPECT_EQ(metric(m, "microllm_requests_running"), 0) << m;
  EXPECT_EQ(metric(m, "microllm_kv_blocks_used"), 0) << m;
  EXPECT_LT(metric(m, "microllm_generated_tokens_total"), max_tokens) << m;
  EXPECT_NE(m.find("microllm_requests_total{endpoint=\"/v1/completions\",status=\"499\"} 1"), std::string::npos) << m;
  std::cout << "freed " << seconds << " s after the client left, after "
            << metric(m, "microllm_generated_tokens_total") << " of " << max_tokens << " tokens\n";
}

// SIGTERM (stop()) during a stream: an error event OpenAI's SDKs raise, then [DONE]; never a finish_reason
// outside OpenAI's values. A waiting non-streaming request gets a 503.
TEST(ServeShutdown, StreamsEndWithAnErrorEvent) {
  const testing::TinyModelDir dir(testing::fresh_seed(), /*window=*/16384);
  Server server(tiny_options(dir));
  server.start();
  std::atomic<bool> streaming{false};
  std::string body;
  int whole_status = 0;
  std::thread stream_client([&] {
    httplib::Client c("127.0.0.1", server.port());
    c.set_read_timeout(60);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.headers = {{"Content-Type", "application/json"}};
    req.body = endless(16000, true).dump();
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      body.append(data, n);
      if (body.find("data: {") != std::string::npos) streaming = true;
      return true;
    };
    httplib::Response res;
    httplib::Error error = httplib::Error::Success;
    c.send(req, res, error);
  });
  std::thread whole_client([&] {
    auto res = client_of(server).Post("/v1/completions", endless(16000, false).dump(), "application/json");
    if (res) whole_status = res->status;
  });
  for (int i = 0; i < 500 && !streaming; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(streaming) << body;
  server.stop();
  stream_client.join();
  whole_client.join();
  const Sse sse = parse_sse(body, false);
  ASSERT_TRUE(sse.error) << body.substr(body.size() > 400 ? body.size() - 400 : 0);
  EXPECT_EQ((*sse.error)["code"], "server_shutdown");
  EXPECT_EQ((*sse.error)["type"], "server_error");
  EXPECT_TRUE(sse.done);
  for (const json& chunk : sse.chunks) EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null()) << chunk;
  EXPECT_EQ(whole_status, 503);
}

// "cmpl-" or "chatcmpl-" and 24 lowercase hex digits.
bool is_response_id(const std::string& id) {
  const std::string prefix = id.rfind("chatcmpl-", 0) == 0 ? "chatcmpl-" : "cmpl-";
  if (id.rfind(prefix, 0) != 0 || id.size() != prefix.size() + 24) return false;
  return id.find_first_not_of("0123456789abcdef", prefix.size()) == std::string::npos;
}

TEST(ServeIds, ResponseIdsAreRandomAcrossRequestsAndRestarts) {
  const testing::TinyModelDir dir(testing::fresh_seed());
  std::vector<std::string> ids;
  for (int restart = 0; restart < 2; ++restart) {
    Server server(tiny_options(dir));
    server.start();
    httplib::Client c = client_of(server);
    for (int i = 0; i < 2; ++i) {
      auto res = c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 1})", "application/json");
      ASSERT_TRUE(res);
      ids.push_back(json::parse(res->body)["id"]);
      EXPECT_TRUE(is_response_id(ids.back())) << ids.back();
    }
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()), ids.end()) << "an id repeated";
}

TEST(ServeCors, PreflightsAndOriginsOnlyWithCors) {
  const testing::TinyModelDir dir(testing::fresh_seed());
  ServerOptions options = tiny_options(dir);
  options.api_key = "k";
  options.cors_origins = {"https://a.example"};
  Server server(options);
  server.start();
  httplib::Client c = client_of(server);
  auto preflight = c.Options("/v1/chat/completions", {{"Origin", "https://a.example"},
                                                       {"Access-Control-Request-Method", "POST"},
                                                       {"Access-Control-Request-Headers", "authorization,content-type"}});
  ASSERT_TRUE(preflight);
  EXPECT_EQ(preflight->status, 204);  // no key needed
  EXPECT_EQ(preflight->get_header_value("Access-Control-Allow-Origin"), "https://a.example");
  EXPECT_NE(preflight->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_NE(preflight->get_header_value("Access-Control-Allow-Headers").find("Authorization"), std::string::npos);
  c.set_bearer_token_auth("k");
  auto allowed = c.Get("/v1/models", {{"Origin", "https://a.example"}});
  ASSERT_TRUE(allowed);
  EXPECT_EQ(allowed->get_header_value("Access-Control-Allow-Origin"), "https://a.example");
  EXPECT_EQ(allowed->get_header_value("Vary"), "Origin");
  auto streamed = c.Post("/v1/completions", {{"Origin", "https://a.example"}},
                         R"({"prompt": "x", "max_tokens": 2, "stream": true})", "application/json");
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->get_header_value("Access-Control-Allow-Origin"), "https://a.example");
  auto denied = c.Get("/v1/models", {{"Origin", "https://evil.example"}});
  ASSERT_TRUE(denied);
  EXPECT_FALSE(denied->has_header("Access-Control-Allow-Origin"));
  server.stop();

  options.cors_origins = {"*"};
  Server any(options);
  any.start();
  auto star = client_of(any).Get("/health", {{"Origin", "https://b.example"}});
  ASSERT_TRUE(star);
  EXPECT_EQ(star->get_header_value("Access-Control-Allow-Origin"), "*");
  any.stop();

  options.cors_origins.clear();
  Server none(options);
  none.start();
  auto no_preflight = client_of(none).Options("/v1/models", {{"Origin", "https://a.example"}});
  ASSERT_TRUE(no_preflight);
  EXPECT_EQ(no_preflight->status, 404);
  EXPECT_FALSE(no_preflight->has_header("Access-Control-Allow-Origin"));
}

// A second server on a port in use is an error, in the library and as a second process; so is a port past 65535.
TEST(ServePorts, OneServerPerPortAndPortsWithinRange) {
  const testing::TinyModelDir dir(testing::fresh_seed());
  Server first(tiny_options(dir));
  first.start();
  ServerOptions same = tiny_options(dir);
  same.port = first.port();
  Server second(same);
  const std::string m = testing::error_message([&] { second.start(); });
  EXPECT_NE(m.find("address already in use"), std::string::npos) << m;
  ServerOptions out_of_range = tiny_options(dir);
  out_of_range.port = 70000;
  const std::string range = testing::error_message([&] { Server s(out_of_range); });
  EXPECT_NE(range.find("port must be in 0-65535, got 70000"), std::string::npos) << range;

  const std::filesystem::path bin = testing::microllm_binary();
  if (!std::filesystem::exists(bin)) GTEST_SKIP() << bin << " is not built";
  const std::string serve = "timeout 60 '" + bin.string() + "' serve --model '" + dir.dir.string() + "' --port ";
  std::string output;
  EXPECT_EQ(testing::run_command(serve + std::to_string(first.port()), output), 1) << output;
  EXPECT_NE(output.find("address already in use"), std::string::npos) << output;
  output.clear();
  EXPECT_NE(testing::run_command(serve + "70000", output), 0) << output;
  EXPECT_NE(output.find("65535"), std::string::npos) << output;
  EXPECT_EQ(client_of(first).Get("/health")->status, 200);  // the first server is untouched
}


// `serve --trace FILE --trace-requests N`: the trace closes once N completion requests are answered and holds
// their engine steps; the server goes on serving.
TEST(ServeTrace, TheWindowEndsAfterTheRequestsAsked) {
  const std::filesystem::path bin = testing::microllm_binary();
  if (!std::filesystem::exists(bin)) GTEST_SKIP() << bin << " is not built";
  const testing::TinyModelDir dir(testing::fresh_seed());
  const std::filesystem::path log = dir.dir / "serve.log", trace = dir.dir / "serve.trace.json";
  std::string pid;
  ASSERT_EQ(testing::run_command("timeout 120 '" + bin.string() + "' serve --model '" + dir.dir.string() +
                                     "' --port 0 --trace '" + trace.string() + "' --trace-requests 2 > '" +
                                     log.string() + "' 2>&1 & echo $!",
                                 pid),
            0);
  const auto log_text = [&] {
    std::ifstream in(log);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  // Polls the log until `part` shows (the server's address, then the trace's line) or 60 s pass.
  const auto wait_for = [&](const std::string& part) {
    for (auto end = Clock::now() + std::chrono::seconds(60); Clock::now() < end;) {
      if (log_text().find(part) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  };
  ASSERT_TRUE(wait_for("http://127.0.0.1:")) << log_text();
  const std::string text = log_text(), address = "http://127.0.0.1:";
  const int port = std::stoi(text.substr(text.find(address) + address.size()));
  httplib::Client c("127.0.0.1", port);
  for (int i = 0; i < 2; ++i) {
    auto res = c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 3})", "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
  }
  EXPECT_TRUE(wait_for("trace: " + trace.string())) << log_text();
  auto after = c.Get("/health");  // still serving after the window
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200);
  std::string ignored;
  testing::run_command("kill -TERM " + pid, ignored);
  std::ifstream in(trace);
  const json events = json::parse(in)["traceEvents"];
  size_t steps = 0;
  for (const json& e : events) steps += e.value("name", "") == "engine.step";
  EXPECT_GT(steps, 0u) << "no engine steps in the trace";
}

}  // namespace
}  // namespace microllm::serve
