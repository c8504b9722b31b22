#include "serve/engine_loop.h"

#include <algorithm>

#include "microllm/core/error.h"
#include "microllm/generate/stop.h"
#include "serve/openai_api.h"

namespace microllm::serve {

namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

// A job as the engine thread sees it: its decoder, its stop strings and how far it got.
struct EngineLoop::Active {
  std::shared_ptr<Job> job;
  std::shared_ptr<StreamDecoder> stream;  // null: a byte-level model
  generate::StopStringMatcher matcher;
  int64_t count = 0;
  bool ended = false;
  Clock::time_point last;

  void send(const std::string& piece) {
    if (piece.empty()) return;
    std::lock_guard lock(job->m);
    job->pending += piece;
    job->text += piece;
    job->cv.notify_all();
  }
  void end(JobEnd how, const std::string& reason = "", const std::string& error = "") {
    if (ended) return;
    ended = true;
    std::lock_guard lock(job->m);
    if (job->end != JobEnd::running) return;  // failed already (fail_all)
    job->end = how;
    job->finish_reason = reason;
    job->error = error;
    job->completion_tokens = count;
    job->cv.notify_all();
  }
  std::string decode(int32_t token) {
    if (stream) return stream->push(token);
    return std::string(1, static_cast<char>(static_cast<uint8_t>(token)));  // a byte model (ids 0..255)
  }
};

EngineLoop::EngineLoop(generate::Engine& engine, const Tokenizer* tokenizer, Metrics& metrics)
    : engine_(engine), tokenizer_(tokenizer), metrics_(metrics) {}

EngineLoop::~EngineLoop() { stop(); }

void EngineLoop::start() { thread_ = std::thread([this] { run(); }); }

void EngineLoop::submit(const std::shared_ptr<Job>& job) {
  auto active = std::make_shared<Active>(Active{job, nullptr, generate::StopStringMatcher(job->stop), 0, false,
                                                Clock::now()});
  if (tokenizer_) active->stream = std::make_shared<StreamDecoder>(tokenizer_->stream_decoder(/*skip_special_tokens=*/true));
  generate::EngineRequest request;
  request.prompt = job->prompt;
  request.max_new_tokens = job->max_tokens;
  request.sampling = job->sampling;
  // Stop ids are handled here (on_token): the text before them must be finished first.
  request.on_token = [this, active](int32_t token) { return on_token(*active, token); };
  request.on_finish = [this, active](const generate::Generation& g) {
    if (g.finish_reason == generate::FinishReason::callback) {
      active->end(stopping_ ? JobEnd::shutdown : JobEnd::cancelled);
    } else {
      finish_text(*active, "length");  // max tokens or the model's window
    }
    std::lock_guard lock(m_);
    live_.erase(active->job->engine_id);
  };
  {
    std::lock_guard lock(m_);
    if (stopping_) throw ApiError(503, "the server is shutting down", "server_error", "", "server_shutdown");
    try {
      job->engine_id = engine_.submit(std::move(request));
    } catch (const ValueError& e) {  // more KV blocks than the cache has, say
      throw ApiError(400, e.what(), "invalid_request_error", "max_tokens", "context_length_exceeded");
    }
    live_[job->engine_id] = job;
  }
  metrics_.prompt_tokens(static_cast<int64_t>(job->prompt.size()));
  cv_.notify_one();
}

void EngineLoop::cancel(Job& job) {
  job.cancel_requested = true;
  engine_.cancel(job.engine_id);
}

// The end of a sequence that was not stopped by a stop string: the decoder's and the matcher's tails.
void EngineLoop::finish_text(Active& a, const std::string& reason) {
  std::string tail;
  if (a.stream) tail = a.matcher.push(a.stream->finish());
  if (a.matcher.stopped()) {
    a.send(tail);
    a.end(JobEnd::finished, "stop");
    return;
  }
  a.send(tail + a.matcher.flush());
  a.end(JobEnd::finished, reason);
}

// Returns whether the sequence goes on.
bool EngineLoop::on_token(Active& a, int32_t token) {
  if (a.ended) return false;
  const Clock::time_point now = Clock::now();
  if (a.count == 0) metrics_.first_token(seconds_between(a.job->arrived, now));
  else metrics_.next_token(seconds_between(a.last, now));
  a.last = now;
  ++a.count;
  if (a.job->cancel_requested || stopping_) {
    a.end(stopping_ ? JobEnd::shutdown : JobEnd::cancelled);
    return false;
  }
  const std::vector<int64_t>& ids = a.job->stop_ids;
  if (std::find(ids.begin(), ids.end(), int64_t{token}) != ids.end()) {  // not decoded
    finish_text(a, "stop");
    return false;
  }
  if (token >= 0 && (a.stream || token < 256)) {
    a.send(a.matcher.push(a.decode(token)));
    if (a.matcher.stopped()) {
      a.end(JobEnd::finished, "stop");
      return false;
    }
  }
  if (a.count >= a.job->max_tokens) {
    finish_text(a, "length");
    return false;
  }
  return true;
}

void EngineLoop::publish_engine_metrics(generate::EngineStats& last) {
  const generate::EngineStats now = engine_.stats();
  metrics_.running = now.prefilling + now.decoding;
  metrics_.queued = now.waiting;
  metrics_.kv_blocks_used = now.kv_blocks_used;
  metrics_.decode_steps(now.decode_steps - last.decode_steps, now.decoded_sequences - last.decoded_sequences);
  last = now;
}

// The engine's thread: steps while there is work, sleeps while there is none.
void EngineLoop::run() {
  generate::EngineStats last = engine_.stats();
  while (true) {
    {
      std::unique_lock lock(m_);
      cv_.wait(lock, [&] { return stopping_ || !engine_.idle(); });
      if (stopping_) break;
    }
    try {
      engine_.step();
    } catch (const std::exception& e) {
      fail_all(str_cat("generation failed: ", e.what()));
    }
    publish_engine_metrics(last);
  }
  // Shutting down: every request still queued or running ends (on_token and on_finish see stopping_), without
  // running the model for the queued ones.
  std::vector<uint64_t> ids;
  {
    std::lock_guard lock(m_);
    for (const auto& [id, job] : live_) ids.push_back(id);
  }
  for (uint64_t id : ids) engine_.cancel(id);
  try {
    engine_.run_until_idle();
  } catch (const std::exception&) {
  }
  publish_engine_metrics(last);
  std::lock_guard lock(m_);
  for (const auto& [id, job] : live_) {  // only if the engine failed on the way: nobody may wait forever
    std::lock_guard job_lock(job->m);
    if (job->end == JobEnd::running) job->end = JobEnd::shutdown;
    job->cv.notify_all();
  }
}

// The engine threw (out of memory, say): every request in it fails (a 500) and is cancelled.
void EngineLoop::fail_all(const std::string& error) {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    std::lock_guard lock(m_);
    for (const auto& [id, job] : live_) jobs.push_back(job);
  }
  for (const std::shared_ptr<Job>& job : jobs) {
    {
      std::lock_guard lock(job->m);
      if (job->end == JobEnd::running) {
        job->end = JobEnd::failed;
        job->error = error;
      }
      job->cv.notify_all();
    }
    cancel(*job);
  }
}

void EngineLoop::stop() {
  {
    std::lock_guard lock(m_);
    if (stopping_.exchange(true)) return;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace microllm::serve
