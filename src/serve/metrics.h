// The server's Prometheus metrics (GET /metrics): request counters by endpoint and status, token counters,
// latency histograms and the engine's gauges. Thread-safe. Private to the serve layer.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace microllm::serve {

// A Prometheus histogram with fixed upper bounds (+Inf implied).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  void write(std::ostringstream& out, const char* name, const char* help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  // status 499: the client closed the connection before its answer (nginx's code for it).
  void count_request(const std::string& endpoint, int status);
  void first_token(double seconds);  // from the request's arrival
  void next_token(double seconds);   // since the request's previous token
  void prompt_tokens(int64_t n);
  // Decode steps of the engine and the sequences they decoded, since the last call.
  void decode_steps(uint64_t steps, uint64_t sequences);
  std::atomic<int64_t> running{0}, queued{0}, kv_blocks_used{0}, kv_blocks_total{0};
  std::atomic<uint64_t> completions_answered{0};  // /v1/completions and /v1/chat/completions, any status

  std::string text() const;  // the Prometheus text format

 private:
  mutable std::mutex m_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t generated_tokens_ = 0, prompt_tokens_ = 0, batches_ = 0, batched_requests_ = 0;
  Histogram ttft_{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  Histogram itl_{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
};

}  // namespace microllm::serve
