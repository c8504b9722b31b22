#include "serve/metrics.h"

#include <algorithm>

namespace microllm::serve {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const auto i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::write(std::ostringstream& out, const char* name, const char* help) const {
  out << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out << name << "_bucket{le=\"" << bounds_[i] << "\"} " << cumulative << "\n";
  }
  out << name << "_bucket{le=\"+Inf\"} " << count_ << "\n"
      << name << "_sum " << sum_ << "\n"
      << name << "_count " << count_ << "\n";
}

void Metrics::count_request(const std::string& endpoint, int status) {
  if (endpoint == "/v1/completions" || endpoint == "/v1/chat/completions") ++completions_answered;
  std::lock_guard lock(m_);
  ++requests_[{endpoint, status}];
}

void Metrics::first_token(double seconds) {
  std::lock_guard lock(m_);
  ttft_.observe(seconds);
  ++generated_tokens_;
}

void Metrics::next_token(double seconds) {
  std::lock_guard lock(m_);
  itl_.observe(seconds);
  ++generated_tokens_;
}

void Metrics::prompt_tokens(int64_t n) {
  std::lock_guard lock(m_);
  prompt_tokens_ += static_cast<uint64_t>(n);
}

void Metrics::decode_steps(uint64_t steps, uint64_t sequences) {
  std::lock_guard lock(m_);
  batches_ += steps;
  batched_requests_ += sequences;
}

std::string Metrics::text() const {
  std::lock_guard lock(m_);
  std::ostringstream out;
  out << "# HELP microllm_requests_total HTTP requests by endpoint and status code (499: the client left first).\n"
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

}  // namespace microllm::serve
