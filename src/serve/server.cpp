// The HTTP server (cpp-httplib) and the scheduler thread that runs the engine. See serve/server.h.
#include "microllm/serve/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "microllm/core/error.h"
#include "microllm/generate/engine.h"
#include "microllm/generate/generate.h"
#include "microllm/models/config.h"
#include "microllm/models/loader.h"
#include "microllm/tokenizer/tokenizer.h"
#include "serve/openai_api.h"

namespace microllm::serve {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// ---- Metrics (Prometheus text format) ----

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v) {
    const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
    ++counts_[i];
    sum_ += v;
    ++count_;
  }
  void write(std::ostringstream& out, const char* name, const char* help) const {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
    uint64_t cumulative = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
      cumulative += counts_[i];
      out << name << "_bucket{le=\"" << bounds_[i] << "\"} " << cumulative << "\n";
    }
    out << name << "_bucket{le=\"+Inf\"} " << count_ << "\n" << name << "_sum " << sum_ << "\n"
        << name << "_count " << count_ << "\n";
  }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  void count_request(const std::string& endpoint, int status) {
    std::lock_guard lock(m_);
    ++requests_[{endpoint, status}];
  }
  void first_token(double seconds) {
    std::lock_guard lock(m_);
    ttft_.observe(seconds);
    ++generated_tokens_;
  }
  void next_token(double seconds) {
    std::lock_guard lock(m_);
    itl_.observe(seconds);
    ++generated_tokens_;
  }
  void prompt_tokens(int64_t n) {
    std::lock_guard lock(m_);
    prompt_tokens_ += static_cast<uint64_t>(n);
  }
  // Decode steps of the engine and the sequences they decoded, since the last call.
  void decode_steps(uint64_t steps, uint64_t sequences) {
    std::lock_guard lock(m_);
    batches_ += steps;
    batched_requests_ += sequences;
  }
  std::atomic<int64_t> running{0}, queued{0}, kv_blocks_used{0}, kv_blocks_total{0};

  std::string text() const {
    std::lock_guard lock(m_);
    std::ostringstream out;
    out << "# HELP microllm_requests_total HTTP requests by endpoint and status code.\n"
        << "# TYPE microllm_requests_total counter\n";
    for (const auto& [key, n] : requests_) {
      out << "microllm_requests_total{endpoint=\"" << key.first << "\",status=\"" << key.second << "\"} " << n << "\n";
    }
    out << "# HELP microllm_generated_tokens_total Tokens generated (all requests, cancelled ones included).\n"
        << "# TYPE microllm_generated_tokens_total counter\nmicrollm_generated_tokens_total " << generated_tokens_
        << "\n# HELP microllm_prompt_tokens_total Prompt tokens of requests admitted.\n"
        << "# TYPE microllm_prompt_tokens_total counter\nmicrollm_prompt_tokens_total " << prompt_tokens_ << "\n";
    out << "# HELP microllm_batches_total Decode steps the engine ran (one token for each decoding sequence).\n"
        << "# TYPE microllm_batches_total counter\nmicrollm_batches_total " << batches_
        << "\n# HELP microllm_batched_requests_total Sequences decoded in those steps (summed over steps).\n"
        << "# TYPE microllm_batched_requests_total counter\nmicrollm_batched_requests_total " << batched_requests_
        << "\n";
    ttft_.write(out, "microllm_time_to_first_token_seconds", "From the request's arrival to its first token.");
    itl_.write(out, "microllm_inter_token_latency_seconds", "Between consecutive tokens of a request.");
    out << "# HELP microllm_requests_running Requests being generated.\n# TYPE microllm_requests_running gauge\n"
        << "microllm_requests_running " << running.load() << "\n"
        << "# HELP microllm_requests_queued Requests waiting for the model.\n# TYPE microllm_requests_queued gauge\n"
        << "microllm_requests_queued " << queued.load() << "\n"
        << "# HELP microllm_kv_blocks_used KV cache blocks held by requests.\n# TYPE microllm_kv_blocks_used gauge\n"
        << "microllm_kv_blocks_used " << kv_blocks_used.load() << "\n"
        << "# HELP microllm_kv_blocks_total KV cache blocks in the pool.\n# TYPE microllm_kv_blocks_total gauge\n"
        << "microllm_kv_blocks_total " << kv_blocks_total.load() << "\n";
    return out.str();
  }

 private:
  mutable std::mutex m_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t generated_tokens_ = 0, prompt_tokens_ = 0, batches_ = 0, batched_requests_ = 0;
  Histogram ttft_{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  Histogram itl_{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
};

// ---- Jobs: one request on its way through the scheduler ----

struct Job {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;  // already capped to the model's window
  generate::SamplingParams sampling;
  std::vector<std::string> stop;
  const std::vector<int64_t>* stop_ids = nullptr;
  Clock::time_point arrived = Clock::now();
  std::atomic<bool> cancelled{false};
  uint64_t engine_id = 0;  // set by submit()

  // Written by the scheduler, read by the HTTP thread.
  std::mutex m;
  std::condition_variable cv;
  std::string pending;  // text not yet taken by the HTTP thread
  std::string text;     // all of it (for stream false)
  bool done = false;
  std::string finish_reason;  // "stop", "length" ("cancelled" when nobody listens any more)
  std::string error;          // generation failed (a 500)
  int64_t completion_tokens = 0;

};

}  // namespace

struct Server::Impl {
  ServerOptions options;
  std::string name;
  std::unique_ptr<nn::TransformerLM> model;
  std::optional<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  DType compute_dtype = DType::f32;
  std::vector<int64_t> stop_ids, chat_stop_ids;
  int64_t created = unix_time();

  Metrics metrics;
  httplib::Server http;
  socket_t listening_socket = INVALID_SOCKET;  // httplib.h's socket type; set while binding (start())
  std::thread listener, scheduler;
  std::atomic<bool> stopping{false};
  std::atomic<bool> started{false};
  std::atomic<uint64_t> next_id{1};
  int bound_port = 0;

  std::unique_ptr<generate::Engine> engine;
  std::mutex queue_m;  // guards live; the scheduler sleeps on queue_cv while the engine is idle
  std::condition_variable queue_cv;
  std::map<uint64_t, std::shared_ptr<Job>> live;  // submitted and not finished, by engine id
  std::mutex stop_m;
  std::condition_variable stop_cv;
  bool stopped = false;

  explicit Impl(ServerOptions o) : options(std::move(o)) {
    MICROLLM_CHECK(!options.model_dir.empty(), ValueError, "serve", "no model directory");
    MICROLLM_CHECK(options.max_batch >= 1, ValueError, "serve", "max_batch must be >= 1");
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
    compute_dtype = load.dtype;
    model = models::load_model(options.model_dir, load).model;
    model->fuse_projections();
    tokenizer = Tokenizer::load_if_present(options.model_dir);
    if (tokenizer && tokenizer->chat_template_source()) {
      try {
        chat_template = tokenizer->chat_template();
      } catch (const NotSupportedError&) {  // an unknown template: /v1/chat/completions answers 400
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
    engine_options.dtype = compute_dtype;
    engine_options.kv_blocks = options.kv_blocks;
    engine_options.prefill_chunk = options.prefill_chunk;
    engine = std::make_unique<generate::Engine>(*model, engine_options);
    metrics.kv_blocks_total = engine->stats().kv_blocks_total;
  }

  // ---- Requests -> jobs ----

  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const {
    if (tokenizer) return tokenizer->encode(text, add_special_tokens);
    return std::vector<int32_t>(reinterpret_cast<const uint8_t*>(text.data()),
                                reinterpret_cast<const uint8_t*>(text.data()) + text.size());
  }

  std::shared_ptr<Job> make_job(const CompletionRequest& r) const {
    const nn::TransformerConfig& config = model->config();
    auto job = std::make_shared<Job>();
    const char* param = "prompt";
    if (r.endpoint == Endpoint::chat_completions) {
      param = "messages";
      if (!chat_template) {
        throw ApiError(400, "the model " + name + " has no (supported) chat template: use /v1/completions",
                       "invalid_request_error", "messages", "no_chat_template");
      }
      try {
        job->prompt = encode(chat_template->render(r.messages), /*add_special_tokens=*/false);
      } catch (const ValueError& e) {
        throw ApiError(400, e.what(), "invalid_request_error", "messages");
      }
    } else if (r.prompt_ids) {
      job->prompt = *r.prompt_ids;
      for (int32_t id : job->prompt) {
        if (id >= config.vocab_size) {
          throw ApiError(400, str_cat("prompt token id ", id, " is outside the vocabulary of ", config.vocab_size),
                         "invalid_request_error", "prompt");
        }
      }
    } else {
      try {
        job->prompt = encode(r.prompt, /*add_special_tokens=*/true);
      } catch (const ValueError& e) {
        throw ApiError(400, e.what(), "invalid_request_error", "prompt");
      }
    }
    if (job->prompt.empty()) {  // an empty prompt starts from BOS
      if (config.bos_token_id >= 0) job->prompt.push_back(static_cast<int32_t>(config.bos_token_id));
      else if (tokenizer && tokenizer->bos_id()) job->prompt.push_back(*tokenizer->bos_id());
      else throw ApiError(400, "the prompt is empty and the model has no bos token", "invalid_request_error", param);
    }
    const auto prompt_tokens = static_cast<int64_t>(job->prompt.size());
    if (prompt_tokens >= config.max_position_embeddings) {
      throw ApiError(400,
                     str_cat("This model's maximum context length is ", config.max_position_embeddings,
                             " tokens; the prompt has ", prompt_tokens, " tokens, which leaves no room to generate."),
                     "invalid_request_error", param, "context_length_exceeded");
    }
    const int64_t wanted =
        r.max_tokens.value_or(r.endpoint == Endpoint::completions ? 16 : options.default_max_tokens);
    job->max_tokens = std::min(wanted, config.max_position_embeddings - prompt_tokens);
    job->sampling.temperature = r.temperature;
    job->sampling.top_p = r.top_p;
    job->sampling.top_k = r.top_k;
    job->sampling.presence_penalty = r.presence_penalty;
    job->sampling.frequency_penalty = r.frequency_penalty;
    job->sampling.seed = r.seed.value_or(next_id.load() * 0x9E3779B97F4A7C15ull);
    job->stop = r.stop;
    job->stop_ids = r.endpoint == Endpoint::chat_completions ? &chat_stop_ids : &stop_ids;
    return job;
  }

  // Hands the job to the engine; its tokens come back through on_token on the scheduler thread.
  void submit(const std::shared_ptr<Job>& job) {
    auto active = std::make_shared<Active>(Active{job, nullptr, generate::StopStringMatcher(job->stop), 0, false,
                                                  Clock::now()});
    if (tokenizer) active->stream = std::make_shared<StreamDecoder>(tokenizer->stream_decoder(/*skip_special_tokens=*/true));
    generate::EngineRequest request;
    request.prompt = job->prompt;
    request.max_new_tokens = job->max_tokens;
    request.sampling = job->sampling;
    // Stop ids are the server's to handle (on_token): the text before them must be finished first.
    request.on_token = [this, active](int32_t token) { return on_token(*active, token); };
    request.on_finish = [this, active](const generate::Generation& g) {
      if (!active->finished) {
        if (g.finish_reason == generate::FinishReason::callback) active->finish("cancelled");
        else finish_text(*active, "length");  // max tokens or the model's window
      }
      std::lock_guard lock(queue_m);
      live.erase(active->job->engine_id);
    };
    {
      std::lock_guard lock(queue_m);
      if (stopping) throw ApiError(503, "the server is shutting down", "server_error");
      try {
        job->engine_id = engine->submit(std::move(request));
      } catch (const ValueError& e) {  // more KV blocks than the cache has, say
        throw ApiError(400, e.what(), "invalid_request_error", "max_tokens", "context_length_exceeded");
      }
      live[job->engine_id] = job;
    }
    metrics.prompt_tokens(static_cast<int64_t>(job->prompt.size()));
    queue_cv.notify_one();
  }

  void cancel(Job& job) {
    job.cancelled = true;
    engine->cancel(job.engine_id);
  }

  // ---- The scheduler ----

  struct Active {
    std::shared_ptr<Job> job;
    std::shared_ptr<StreamDecoder> stream;
    generate::StopStringMatcher matcher;
    int64_t count = 0;
    bool finished = false;
    Clock::time_point last;

    void send(const std::string& piece) {
      if (piece.empty()) return;
      std::lock_guard lock(job->m);
      job->pending += piece;
      job->text += piece;
      job->cv.notify_all();
    }
    void finish(const std::string& reason, const std::string& error = "") {
      if (finished) return;
      finished = true;
      std::lock_guard lock(job->m);
      job->done = true;
      job->finish_reason = reason;
      job->error = error;
      job->completion_tokens = count;
      job->cv.notify_all();
    }
  };

  std::string decode(Active& a, int32_t token) const {
    if (a.stream) return a.stream->push(token);
    return std::string(1, static_cast<char>(static_cast<uint8_t>(token)));  // a byte model (ids 0..255)
  }

  // The end of a sequence that was not stopped by a stop string: the decoder's and the matcher's tails.
  void finish_text(Active& a, const std::string& reason) {
    std::string tail;
    if (a.stream) tail = a.matcher.push(a.stream->finish());
    if (a.matcher.stopped()) {
      a.send(tail);
      a.finish("stop");
      return;
    }
    a.send(tail + a.matcher.flush());
    a.finish(reason);
  }

  // Returns whether the sequence goes on.
  bool on_token(Active& a, int32_t token) {
    if (a.finished) return false;
    const Clock::time_point now = Clock::now();
    if (a.count == 0) metrics.first_token(seconds_between(a.job->arrived, now));
    else metrics.next_token(seconds_between(a.last, now));
    a.last = now;
    ++a.count;
    if (a.job->cancelled || stopping) {
      a.finish("cancelled");
      return false;
    }
    const std::vector<int64_t>& ids = *a.job->stop_ids;
    if (std::find(ids.begin(), ids.end(), int64_t{token}) != ids.end()) {  // not decoded
      finish_text(a, "stop");
      return false;
    }
    if (token >= 0 && (a.stream || token < 256)) {
      const std::string piece = a.matcher.push(decode(a, token));
      a.send(piece);
      if (a.matcher.stopped()) {
        a.finish("stop");
        return false;
      }
    }
    if (a.count >= a.job->max_tokens) {
      finish_text(a, "length");
      return false;
    }
    return true;
  }

  void publish_engine_metrics(generate::EngineStats& last) {
    const generate::EngineStats now = engine->stats();
    metrics.running = now.prefilling + now.decoding;
    metrics.queued = now.waiting;
    metrics.kv_blocks_used = now.kv_blocks_used;
    metrics.decode_steps(now.decode_steps - last.decode_steps, now.decoded_sequences - last.decoded_sequences);
    last = now;
  }

  // The engine's thread: steps while there is work, sleeps while there is none.
  void scheduler_loop() {
    generate::EngineStats last = engine->stats();
    while (true) {
      {
        std::unique_lock lock(queue_m);
        queue_cv.wait(lock, [&] { return stopping || !engine->idle(); });
        if (stopping) break;
      }
      try {
        engine->step();
      } catch (const std::exception& e) {
        fail_all(str_cat("generation failed: ", e.what()));
      }
      publish_engine_metrics(last);
    }
    // Shutting down: every request still queued or running ends as cancelled (on_token and on_finish see
    // `stopping`), without running the model for the queued ones.
    std::vector<uint64_t> ids;
    {
      std::lock_guard lock(queue_m);
      for (const auto& [id, job] : live) ids.push_back(id);
    }
    for (uint64_t id : ids) engine->cancel(id);
    try {
      engine->run_until_idle();
    } catch (const std::exception&) {
    }
    publish_engine_metrics(last);
  }

  // The engine threw (out of memory, say): every request in it fails with a 500 and is cancelled.
  void fail_all(const std::string& error) {
    std::vector<std::shared_ptr<Job>> jobs;
    {
      std::lock_guard lock(queue_m);
      for (const auto& [id, job] : live) jobs.push_back(job);
    }
    for (const std::shared_ptr<Job>& job : jobs) {
      {
        std::lock_guard lock(job->m);
        if (!job->done) {
          job->done = true;
          job->finish_reason = "error";
          job->error = error;
        }
        job->cv.notify_all();
      }
      cancel(*job);
    }
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

  static std::string sse(const std::string& data) { return "data: " + data + "\n\n"; }

  void handle_completion(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
    const std::string path = endpoint_path(endpoint);
    try {
      check_auth(req);
      const CompletionRequest r = parse_completion_request(req.body, endpoint);
      std::shared_ptr<Job> job = make_job(r);
      ResponseInfo info;
      info.endpoint = endpoint;
      info.id = str_cat(endpoint == Endpoint::completions ? "cmpl-" : "chatcmpl-", next_id.fetch_add(1));
      info.created = unix_time();
      info.model = r.model.empty() ? name : r.model;
      submit(job);
      const Usage usage_base{static_cast<int64_t>(job->prompt.size()), 0};
      if (r.stream) {
        stream_response(res, job, info, usage_base);
        metrics.count_request(path, 200);
        return;
      }
      std::unique_lock lock(job->m);
      while (!job->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return job->done; })) {
        if (stopping) {
          cancel(*job);
          throw ApiError(503, "the server is shutting down", "server_error");
        }
      }
      if (!job->error.empty()) throw ApiError(500, job->error, "server_error");
      if (job->finish_reason == "cancelled") throw ApiError(503, "the server is shutting down", "server_error");
      Usage usage = usage_base;
      usage.completion_tokens = job->completion_tokens;
      res.set_content(completion_body(info, job->text, job->finish_reason, usage), "application/json");
      metrics.count_request(path, 200);
    } catch (const ApiError& e) {
      reply_error(res, path, e);
    } catch (const Error& e) {
      reply_error(res, path, ApiError(400, e.what()));
    } catch (const std::exception& e) {
      reply_error(res, path, ApiError(500, e.what(), "server_error"));
    }
  }

  void stream_response(httplib::Response& res, const std::shared_ptr<Job>& job, const ResponseInfo& info,
                       const Usage& usage_base) {
    struct State {
      bool sent_role = false;
      Clock::time_point last_write = Clock::now();
    };
    auto state = std::make_shared<State>();
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, info, usage_base, state](size_t, httplib::DataSink& sink) {
          auto write = [&](const std::string& s) {
            if (!sink.write(s.data(), s.size())) return false;
            state->last_write = Clock::now();
            return true;
          };
          auto cancel = [&] {
            this->cancel(*job);  // frees its row and KV blocks at the engine's next step
            return false;
          };
          if (stopping) return cancel();
          if (info.endpoint == Endpoint::chat_completions && !state->sent_role) {
            if (!write(sse(chunk_body(info, "", /*role=*/true)))) return cancel();
            state->sent_role = true;
          }
          std::string text, reason, error;
          bool done = false;
          int64_t tokens = 0;
          {
            std::unique_lock lock(job->m);
            job->cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return !job->pending.empty() || job->done; });
            text.swap(job->pending);
            done = job->done;
            reason = job->finish_reason;
            error = job->error;
            tokens = job->completion_tokens;
          }
          if (!sink.is_writable()) return cancel();
          if (!text.empty() && !write(sse(chunk_body(info, text)))) return cancel();
          if (done) {
            if (!error.empty()) {
              write(sse(error_body(ApiError(500, error, "server_error"))));
            } else {
              Usage usage = usage_base;
              usage.completion_tokens = tokens;
              write(sse(chunk_body(info, "", false, reason, usage)));
            }
            write("data: [DONE]\n\n");
            sink.done();
            return true;
          }
          // A comment line now and then while waiting (in the queue): a client that left is noticed.
          if (Clock::now() - state->last_write > std::chrono::seconds(1) && !write(": keep-alive\n\n")) return cancel();
          return true;
        },
        [this, job](bool success) {
          if (!success) cancel(*job);
        });
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
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      handle_completion(req, res, Endpoint::completions);
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      handle_completion(req, res, Endpoint::chat_completions);
    });
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

  void start() {
    MICROLLM_CHECK(!started.exchange(true), ValueError, "serve", "the server was started already");
    install_routes();
    http.set_socket_options([this](socket_t sock) {
      httplib::default_socket_options(sock);  // what the library sets without a hook (SO_REUSEPORT)
      listening_socket = sock;                // the last one made is the one bound
    });
    if (options.port == 0) {
      bound_port = http.bind_to_any_port(options.host);
      MICROLLM_CHECK(bound_port > 0, IoError, "serve", "cannot bind ", options.host, " (any port)");
    } else {
      MICROLLM_CHECK(http.bind_to_port(options.host, options.port), IoError, "serve", "cannot bind ", options.host, ":",
                     options.port);
      bound_port = options.port;
    }
    widen_accept_queue();
    scheduler = std::thread([this] { scheduler_loop(); });
    listener = std::thread([this] { http.listen_after_bind(); });
  }

  // Debian's compiled cpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG). A burst of more
  // connections at once overflows the accept queue, the kernel drops the extra handshakes, and their clients
  // retry after TCP's initial 1 s timeout: 64 streaming clients starting together measured a largest time to
  // first token of 1.09 s where the server's own (from a request's arrival) was <= 0.5 s. Listening again on
  // the bound socket sets a larger backlog (Linux updates a listening socket's).
  void widen_accept_queue() {
    MICROLLM_CHECK(listening_socket != INVALID_SOCKET && ::listen(listening_socket, SOMAXCONN) == 0, IoError, "serve",
                   "cannot listen on ", options.host, ":", bound_port, " with a backlog of ", SOMAXCONN, ": ",
                   std::strerror(errno));
  }

  void stop() {
    {
      std::lock_guard lock(queue_m);
      if (stopping.exchange(true)) return;
    }
    queue_cv.notify_all();
    if (scheduler.joinable()) scheduler.join();
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

}  // namespace microllm::serve
