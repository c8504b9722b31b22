// The server's engine thread: requests (jobs) go into a generate::Engine, which one thread steps while there is
// work; each job's tokens come back as text (stream decoder, stop ids, stop strings) for the HTTP thread that
// waits on it. Private to the serve layer.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "microllm/generate/engine.h"
#include "microllm/tokenizer/tokenizer.h"
#include "serve/metrics.h"

namespace microllm::serve {

using Clock = std::chrono::steady_clock;

// How a job ended.
enum class JobEnd {
  running,    // not yet
  finished,   // by a stop id, a stop string, max_tokens or the window: finish_reason says which
  cancelled,  // its client went away (cancel)
  shutdown,   // the server stopped before it finished
  failed,     // the engine threw: error says why
};

// One request on its way through the engine. The HTTP thread fills the inputs and submits it; the engine thread
// writes the outputs under `m` and notifies `cv`.
struct Job {
  // Inputs.
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;  // already capped to the model's window
  generate::SamplingParams sampling;
  std::vector<std::string> stop;
  std::vector<int64_t> stop_ids;
  Clock::time_point arrived = Clock::now();
  uint64_t engine_id = 0;  // set by submit()
  std::atomic<bool> cancel_requested{false};

  // Outputs.
  std::mutex m;
  std::condition_variable cv;
  std::string pending;  // text not yet taken by the HTTP thread
  std::string text;     // all of it (for stream false)
  JobEnd end = JobEnd::running;
  std::string finish_reason;  // "stop" or "length" when finished
  std::string error;          // when failed
  int64_t completion_tokens = 0;
};

class EngineLoop {
 public:
  // `tokenizer` may be null (a byte-level checkpoint: ids 0..255 are bytes).
  EngineLoop(generate::Engine& engine, const Tokenizer* tokenizer, Metrics& metrics);
  ~EngineLoop();  // stop()

  void start();  // the engine thread
  // Hands the job to the engine. ApiError: 400 when the engine can never run it (more KV blocks than the cache
  // has), 503 once stopping.
  void submit(const std::shared_ptr<Job>& job);
  // Ends the job at the engine's next step (its row and KV blocks go back); it ends as cancelled. Idempotent.
  void cancel(Job& job);
  // Ends every job (shutdown) and joins the thread. Idempotent.
  void stop();
  bool stopping() const { return stopping_; }

 private:
  struct Active;
  bool on_token(Active& a, int32_t token);
  void finish_text(Active& a, const std::string& reason);
  void publish_engine_metrics(generate::EngineStats& last);
  void run();
  void fail_all(const std::string& error);

  generate::Engine& engine_;
  const Tokenizer* tokenizer_;
  Metrics& metrics_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::mutex m_;  // guards live_; the thread sleeps on cv_ while the engine is idle
  std::condition_variable cv_;
  std::map<uint64_t, std::shared_ptr<Job>> live_;  // submitted and not ended, by engine id
};

}  // namespace microllm::serve
