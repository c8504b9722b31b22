// The HTTP side of the server (cpp-httplib): options, the model, the routes and their SSE streams. The engine
// thread is serve/engine_loop.*, the metrics serve/metrics.*, the request format serve/openai_api.*. See
// serve/server.h.
#include "microllm/serve/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "microllm/core/error.h"
#include "microllm/generate/engine.h"
#include "microllm/models/config.h"
#include "microllm/models/loader.h"
#include "microllm/tokenizer/tokenizer.h"
#include "serve/connection.h"
#include "serve/engine_loop.h"
#include "serve/metrics.h"
#include "serve/openai_api.h"

namespace microllm::serve {

namespace {

namespace fs = std::filesystem;

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string sse(const std::string& data) { return "data: " + data + "\n\n"; }

const ApiError kShuttingDown(503, "the server is shutting down", "server_error", "", "server_shutdown");

// Response ids and default seeds: random, so that they differ across restarts and between servers.
class RandomSource {
 public:
  RandomSource() : engine_((static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()) {}
  uint64_t next() {
    std::lock_guard lock(m_);
    return engine_();
  }
  // prefix + 24 hex digits (96 random bits).
  std::string id(const char* prefix) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out = prefix;
    const uint64_t a = next(), b = next();
    for (int i = 0; i < 16; ++i) out += kHex[(a >> (4 * i)) & 15];
    for (int i = 0; i < 8; ++i) out += kHex[(b >> (4 * i)) & 15];
    return out;
  }

 private:
  std::mutex m_;
  std::mt19937_64 engine_;
};

}  // namespace

struct Server::Impl {
  ServerOptions options;
  std::string name;
  std::unique_ptr<nn::TransformerLM> model;
  std::optional<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  std::vector<int64_t> stop_ids, chat_stop_ids;
  int64_t created = unix_time();
  RandomSource random;

  Metrics metrics;
  std::unique_ptr<generate::Engine> engine;
  std::unique_ptr<EngineLoop> loop;
  httplib::Server http;
  socket_t listening_socket = INVALID_SOCKET;  // httplib.h's socket type; set while binding (start())
  std::thread listener;
  std::atomic<bool> started{false}, stopping{false};
  // Streams whose response is still being written: stop() lets them write their last events (httplib stops
  // calling a content provider once the server stops).
  std::atomic<int> open_streams{0};
  int bound_port = 0;
  std::mutex stop_m;
  std::condition_variable stop_cv;
  bool stopped = false;

  explicit Impl(ServerOptions o) : options(std::move(o)) {
    MICROLLM_CHECK(!options.model_dir.empty(), ValueError, "serve", "no model directory");
    MICROLLM_CHECK(options.max_batch >= 1, ValueError, "serve", "max_batch must be >= 1");
    MICROLLM_CHECK(options.port >= 0 && options.port <= 65535, ValueError, "serve", "port must be in 0-65535, got ",
                   options.port);
    name = options.model_name;
    if (name.empty()) {
      name = fs::path(options.model_dir).lexically_normal().filename().string();
      if (name.empty()) name = fs::path(options.model_dir).lexically_normal().parent_path().filename().string();
      if (name.empty()) name = "model";
    }
    models::LoadOptions load;
    load.device = Device::parse(options.device);
    load.dtype = parse_dtype(options.dtype);
    const bool f64_on_cpu = load.dtype == DType::f64 && load.device.is_cpu();  // the tests' exact comparisons
    MICROLLM_CHECK(load.dtype == DType::f32 || load.dtype == DType::bf16 || f64_on_cpu, ValueError, "serve",
                   "dtype must be f32 or bf16 (or f64 on the CPU), got ", options.dtype, " on ", load.device);
    model = models::load_model(options.model_dir, load).model;
    model->fuse_projections();
    tokenizer = Tokenizer::load_if_present(options.model_dir);
    if (tokenizer && tokenizer->chat_template_source()) {
      try {
        chat_template = tokenizer->chat_template();
      } catch (const Error&) {  // a template the engine cannot parse: /v1/chat/completions answers 400
      }
    }
    // Stop ids as `microllm generate` finds them (config.json, generation_config.json, the tokenizer's eos);
    // for chat also the template's end-of-turn tokens.
    auto stop_ids_of = [&](bool chat) {
      return models::stop_token_ids(options.model_dir, model->config(),
                                    tokenizer ? tokenizer->stop_ids(chat) : std::vector<int32_t>{});
    };
    stop_ids = stop_ids_of(false);
    chat_stop_ids = stop_ids_of(true);
    generate::EngineOptions engine_options;
    engine_options.max_batch = options.max_batch;
    engine_options.dtype = load.dtype;
    engine_options.kv_blocks = options.kv_blocks;
    engine_options.prefill_chunk = options.prefill_chunk;
    engine = std::make_unique<generate::Engine>(*model, engine_options);
    metrics.kv_blocks_total = engine->stats().kv_blocks_total;
    loop = std::make_unique<EngineLoop>(*engine, tokenizer ? &*tokenizer : nullptr, metrics);
  }

  // ---- Requests -> jobs ----

  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const {
    if (tokenizer) return tokenizer->encode(text, add_special_tokens);
    return std::vector<int32_t>(reinterpret_cast<const uint8_t*>(text.data()),
                                reinterpret_cast<const uint8_t*>(text.data()) + text.size());
  }

  std::string decode(const std::vector<int32_t>& ids) const {
    if (tokenizer) return tokenizer->decode(ids);
    std::string text;
    for (int32_t id : ids) text += static_cast<char>(static_cast<uint8_t>(id));
    return text;
  }

  // The prompt's ids: the chat template's rendering of the messages, the ids given, or the encoded text; an
  // empty prompt starts from the bos token.
  std::vector<int32_t> prompt_of(const CompletionRequest& r) const {
    const char* param = r.endpoint == Endpoint::chat_completions ? "messages" : "prompt";
    std::vector<int32_t> prompt;
    if (r.endpoint == Endpoint::chat_completions) {
      if (!chat_template) {
        throw ApiError(400, "the model " + name + " has no (supported) chat template: use /v1/completions",
                       "invalid_request_error", "messages", "no_chat_template");
      }
      try {
        prompt = encode(chat_template->render(r.messages, {.enable_thinking = r.enable_thinking}), false);
      } catch (const ValueError& e) {
        throw ApiError(400, e.what(), "invalid_request_error", "messages");
      }
    } else if (r.prompt_ids) {
      prompt = *r.prompt_ids;
    } else {
      try {
        prompt = encode(r.prompt, /*add_special_tokens=*/true);
      } catch (const ValueError& e) {
        throw ApiError(400, e.what(), "invalid_request_error", "prompt");
      }
    }
    const nn::TransformerConfig& config = model->config();
    for (int32_t id : prompt) {
      if (id >= config.vocab_size) {
        throw ApiError(400, str_cat("prompt token id ", id, " is outside the vocabulary of ", config.vocab_size),
                       "invalid_request_error", param);
      }
    }
    if (prompt.empty()) {
      if (config.bos_token_id >= 0)
        prompt.push_back(static_cast<int32_t>(config.bos_token_id));
      else if (tokenizer && tokenizer->bos_id())
        prompt.push_back(*tokenizer->bos_id());
      else
        throw ApiError(400, "the prompt is empty and the model has no bos token", "invalid_request_error", param);
    }
    if (static_cast<int64_t>(prompt.size()) >= config.context_limit()) {
      throw ApiError(400,
                     str_cat("This model's maximum context length is ", config.context_limit(),
                             " tokens; the prompt has ", prompt.size(), " tokens, which leaves no room to generate."),
                     "invalid_request_error", param, "context_length_exceeded");
    }
    return prompt;
  }

  std::shared_ptr<Job> make_job(const CompletionRequest& r) {
    if (!r.model.empty() && r.model != name) {
      throw ApiError(404, "The model '" + r.model + "' does not exist; this server serves '" + name + "'",
                     "invalid_request_error", "model", "model_not_found");
    }
    const nn::TransformerConfig& config = model->config();
    auto job = std::make_shared<Job>();
    job->prompt = prompt_of(r);
    // max_tokens past the window is cut to what fits beside the prompt.
    const int64_t wanted = r.max_tokens.value_or(r.endpoint == Endpoint::completions ? 16 : options.default_max_tokens);
    job->max_tokens = std::min(wanted, config.context_limit() - static_cast<int64_t>(job->prompt.size()));
    generate::SamplingParams& s = job->sampling;
    s.temperature = r.temperature;
    s.top_p = r.top_p;
    s.top_k = r.top_k;
    s.min_p = r.min_p;
    s.repetition_penalty = r.repetition_penalty;
    s.presence_penalty = r.presence_penalty;
    s.frequency_penalty = r.frequency_penalty;
    s.logit_bias = r.logit_bias;
    for (const auto& [id, bias] : s.logit_bias) {
      if (id >= config.vocab_size) {
        throw ApiError(400, str_cat("logit_bias token id ", id, " is outside the vocabulary of ", config.vocab_size),
                       "invalid_request_error", "logit_bias");
      }
    }
    s.seed = r.seed.value_or(random.next());
    job->stop = r.stop;
    job->stop_ids = r.endpoint == Endpoint::chat_completions ? chat_stop_ids : stop_ids;
    return job;
  }

  // ---- HTTP ----

  void reply_error(httplib::Response& res, const std::string& endpoint, const ApiError& e) {
    res.status = e.status;
    res.set_content(error_body(e), "application/json");
    metrics.count_request(endpoint, e.status);
  }

  void check_auth(const httplib::Request& req) const {
    if (options.api_key.empty()) return;
    if (req.get_header_value("Authorization") != "Bearer " + options.api_key) {
      throw ApiError(401, "invalid or missing API key (Authorization: Bearer <key>)", "authentication_error", "",
                     "invalid_api_key");
    }
  }

  void handle_completion(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
    const std::string path = endpoint_path(endpoint);
    try {
      check_auth(req);
      const CompletionRequest r = parse_completion_request(req.body, endpoint);
      std::shared_ptr<Job> job = make_job(r);
      ResponseInfo info{endpoint, random.id(endpoint == Endpoint::completions ? "cmpl-" : "chatcmpl-"), unix_time(),
                        name, r.include_usage};
      const std::string echoed = r.echo ? (r.prompt_ids ? decode(*r.prompt_ids) : r.prompt) : "";
      loop->submit(job);
      const Usage usage_base{static_cast<int64_t>(job->prompt.size()), 0};
      if (r.stream) {
        stream_response(res, job, info, usage_base, echoed);
        metrics.count_request(path, 200);
        return;
      }
      const std::optional<int> status = wait_whole(req, *job);
      if (status) {  // the client left
        metrics.count_request(path, *status);
        return;
      }
      if (job->end == JobEnd::failed) throw ApiError(500, job->error, "server_error");
      if (job->end != JobEnd::finished) throw kShuttingDown;
      Usage usage = usage_base;
      usage.completion_tokens = job->completion_tokens;
      res.set_content(completion_body(info, echoed + job->text, job->finish_reason, usage), "application/json");
      metrics.count_request(path, 200);
    } catch (const ApiError& e) {
      reply_error(res, path, e);
    } catch (const Error& e) {
      reply_error(res, path, ApiError(400, e.what()));
    } catch (const std::exception& e) {
      reply_error(res, path, ApiError(500, e.what(), "server_error"));
    }
  }

  // Waits until a non-streaming job ends. Returns 499 when its client closed the connection meanwhile (the job
  // is cancelled: its row and KV blocks go back at the engine's next step), nothing otherwise.
  std::optional<int> wait_whole(const httplib::Request& req, Job& job) {
    const std::optional<PeerWatch> peer =
        PeerWatch::find(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
    std::unique_lock lock(job.m);
    while (!job.cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return job.end != JobEnd::running; })) {
      if (loop->stopping()) break;  // the engine thread ends the job as shutdown
      if (peer && peer->closed()) {
        lock.unlock();
        loop->cancel(job);
        return 499;
      }
    }
    job.cv.wait(lock, [&] { return job.end != JobEnd::running; });
    return std::nullopt;
  }

  void stream_response(httplib::Response& res, const std::shared_ptr<Job>& job, const ResponseInfo& info,
                       const Usage& usage_base, const std::string& echoed) {
    struct State {
      bool started = false;
      Clock::time_point last_write = Clock::now();
    };
    auto state = std::make_shared<State>();
    ++open_streams;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, info, usage_base, echoed, state](size_t, httplib::DataSink& sink) {
          auto write = [&](const std::string& s) {
            if (!sink.write(s.data(), s.size())) return false;
            state->last_write = Clock::now();
            return true;
          };
          auto cancel = [&] {
            loop->cancel(*job);  // frees its row and KV blocks at the engine's next step
            return false;
          };
          if (!state->started) {  // chat's role chunk; completions' echoed prompt
            const bool chat = info.endpoint == Endpoint::chat_completions;
            if ((chat || !echoed.empty()) && !write(sse(chunk_body(info, echoed, /*role=*/chat)))) return cancel();
            state->started = true;
          }
          std::string text;
          JobEnd end = JobEnd::running;
          {
            std::unique_lock lock(job->m);
            job->cv.wait_for(lock, std::chrono::milliseconds(100),
                             [&] { return !job->pending.empty() || job->end != JobEnd::running; });
            text.swap(job->pending);
            end = job->end;
          }
          if (!sink.is_writable()) return cancel();
          if (!text.empty() && !write(sse(chunk_body(info, text)))) return cancel();
          if (end != JobEnd::running) {
            finish_stream(*job, end, info, usage_base, write);
            sink.done();
            return true;
          }
          // A comment line now and then while waiting (in the queue): a client that left is noticed.
          if (Clock::now() - state->last_write > std::chrono::seconds(1) && !write(": keep-alive\n\n")) return cancel();
          return true;
        },
        [this, job](bool success) {
          if (!success) loop->cancel(*job);
          --open_streams;
        });
  }

  // The stream's last events: the finish chunk (and the usage chunk when asked for), or an error event when the
  // job did not finish (the engine failed, the server is shutting down), then [DONE].
  template <typename Write>
  static void finish_stream(Job& job, JobEnd end, const ResponseInfo& info, Usage usage, const Write& write) {
    std::lock_guard lock(job.m);
    if (end == JobEnd::finished) {
      write(sse(chunk_body(info, "", false, job.finish_reason)));
      usage.completion_tokens = job.completion_tokens;
      if (info.include_usage) write(sse(usage_chunk_body(info, usage)));
    } else {
      write(sse(error_body(end == JobEnd::failed ? ApiError(500, job.error, "server_error") : kShuttingDown)));
    }
    write("data: [DONE]\n\n");
  }

  void install_routes() {
    http.set_payload_max_length(options.max_body_bytes);
    http.set_keep_alive_timeout(2);  // an idle connection holds a thread (and stop()) this long at most
    const int threads = std::max(options.http_threads, 2);
    http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
      metrics.count_request("/health", 200);
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      metrics.count_request("/metrics", 200);
      res.set_content(metrics.text(), "text/plain; version=0.0.4");
    });
    http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      try {
        check_auth(req);
        res.set_content(models_body(name, created), "application/json");
        metrics.count_request("/v1/models", 200);
      } catch (const ApiError& e) {
        reply_error(res, "/v1/models", e);
      }
    });
    http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      try {
        check_auth(req);
        const std::string id = req.matches[1];
        if (id != name) {
          throw ApiError(404, "The model '" + id + "' does not exist; this server serves '" + name + "'",
                         "invalid_request_error", "model", "model_not_found");
        }
        res.set_content(model_body(name, created), "application/json");
        metrics.count_request("/v1/models/{id}", 200);
      } catch (const ApiError& e) {
        reply_error(res, "/v1/models/{id}", e);
      }
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      handle_completion(req, res, Endpoint::completions);
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      handle_completion(req, res, Endpoint::chat_completions);
    });
    if (!options.cors_origins.empty()) install_cors();
    // Errors httplib answers itself (404, 413 for a body over the limit, 400 for a malformed request) get
    // an OpenAI error object too; the handlers' own errors already have one.
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      std::string endpoint = req.path;
      if (endpoint != "/v1/completions" && endpoint != "/v1/chat/completions" && endpoint != "/v1/models" &&
          endpoint != "/health" && endpoint != "/metrics") {
        endpoint = "other";
      }
      std::string message = str_cat("HTTP ", res.status);
      std::string type = "invalid_request_error", code;
      if (res.status == 404) {
        message = str_cat("no such endpoint: ", req.method, " ", req.path), type = "not_found_error";
      } else if (res.status == 413) {
        message = str_cat("the request body is larger than ", options.max_body_bytes, " bytes");
        code = "request_too_large";
      }
      res.set_content(error_body(ApiError(res.status, message, type, "", code)), "application/json");
      metrics.count_request(endpoint, res.status);
    });
  }

  // The origin a response may name in Access-Control-Allow-Origin: "*" when any is allowed, the request's
  // Origin when it is in the list, nothing otherwise.
  std::string allowed_origin(const httplib::Request& req) const {
    const auto& origins = options.cors_origins;
    if (std::find(origins.begin(), origins.end(), "*") != origins.end()) return "*";
    const std::string origin = req.get_header_value("Origin");
    return std::find(origins.begin(), origins.end(), origin) != origins.end() ? origin : "";
  }

  // CORS (--cors): every response names the allowed origin, and OPTIONS preflights are answered without a key.
  void install_cors() {
    http.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      const std::string origin = allowed_origin(req);
      if (origin.empty()) return;
      res.set_header("Access-Control-Allow-Origin", origin);
      if (origin != "*") res.set_header("Vary", "Origin");
    });
    http.Options(R"(.*)", [this](const httplib::Request& req, httplib::Response& res) {
      res.status = 204;
      if (allowed_origin(req).empty()) return;
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
      res.set_header("Access-Control-Max-Age", "600");
      metrics.count_request("OPTIONS", 204);
    });
  }

  void start() {
    MICROLLM_CHECK(!started.exchange(true), ValueError, "serve", "the server was started already");
    install_routes();
    // SO_REUSEADDR (a restart binds while old connections linger in TIME_WAIT), never SO_REUSEPORT (cpp-httplib's
    // default): with it a second server bound the same port and took half of the first one's connections.
    http.set_socket_options([this](socket_t sock) {
      const int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listening_socket = sock;  // the last one made is the one bound
    });
    errno = 0;
    if (options.port == 0) {
      bound_port = http.bind_to_any_port(options.host);
      MICROLLM_CHECK(bound_port > 0, IoError, "serve", "cannot bind ", options.host,
                     " (any port): ", errno ? std::strerror(errno) : "unknown error");
    } else {
      MICROLLM_CHECK(http.bind_to_port(options.host, options.port), IoError, "serve", "cannot bind ", options.host, ":",
                     options.port, ": ",
                     errno == EADDRINUSE ? "address already in use (is another server listening there?)"
                                         : (errno ? std::strerror(errno) : "unknown error"));
      bound_port = options.port;
    }
    widen_accept_queue();
    loop->start();
    listener = std::thread([this] { http.listen_after_bind(); });
  }

  // Debian's compiled cpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG). A burst of more
  // connections at once overflows the accept queue, the kernel drops the extra handshakes, and their clients
  // retry after TCP's initial 1 s timeout. Listening again on the bound socket sets a larger backlog (Linux
  // updates a listening socket's).
  void widen_accept_queue() {
    MICROLLM_CHECK(listening_socket != INVALID_SOCKET && ::listen(listening_socket, SOMAXCONN) == 0, IoError, "serve",
                   "cannot listen on ", options.host, ":", bound_port, " with a backlog of ", SOMAXCONN, ": ",
                   std::strerror(errno));
  }

  void stop() {
    if (stopping.exchange(true)) {  // another thread stops it: wait for that
      std::unique_lock lock(stop_m);
      stop_cv.wait(lock, [&] { return stopped; });
      return;
    }
    loop->stop();  // every job ends: each open stream writes its error event and [DONE], then closes
    for (int i = 0; i < 200 && open_streams.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    http.stop();
    if (listener.joinable()) listener.join();
    {
      std::lock_guard lock(stop_m);
      stopped = true;
    }
    stop_cv.notify_all();
  }
};

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Server::~Server() { stop(); }
void Server::start() { impl_->start(); }
void Server::stop() { impl_->stop(); }
void Server::wait() {
  std::unique_lock lock(impl_->stop_m);
  impl_->stop_cv.wait(lock, [&] { return impl_->stopped; });
}
int Server::port() const { return impl_->bound_port; }
const std::string& Server::model_name() const { return impl_->name; }
std::string Server::metrics_text() const { return impl_->metrics.text(); }

uint64_t Server::completions_answered() const { return impl_->metrics.completions_answered.load(); }

}  // namespace microllm::serve
