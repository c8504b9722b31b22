// `microllm serve`: an OpenAI-compatible HTTP server over one model (see docs/SERVING.md).
//   microllm serve --model models/Qwen2.5-0.5B-Instruct --port 8080
//   curl -s localhost:8080/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Hi"}]}'
// Ctrl-C (SIGINT) or SIGTERM stops it: running requests are cancelled, the threads joined.
#include <chrono>
#include <csignal>
#include <iostream>
#include <memory>
#include <pthread.h>

#include "commands.h"
#include "microllm/core/error.h"
#include "microllm/core/threads.h"
#include "microllm/serve/server.h"
#include "trace_file.h"

namespace microllm::app {

namespace {

struct ServeCliOptions {
  serve::ServerOptions server;
  int threads = 0;
  std::string trace;          // --trace FILE
  double trace_seconds = 0;   // the trace's window from the server's start; 0: 10 s unless trace_requests is set
  int64_t trace_requests = 0; // or until this many completion requests have been answered
};

// Waits for SIGINT/SIGTERM until the trace's window ends: `seconds` have passed or `requests` completion requests
// have been answered (0: no such bound). Returns the signal, or 0 when the window ended first.
int wait_for_trace_window(const serve::Server& server, const sigset_t& signals, double seconds, int64_t requests) {
  using Clock = std::chrono::steady_clock;
  const auto end = seconds > 0 ? Clock::now() + std::chrono::duration<double>(seconds) : Clock::time_point::max();
  const uint64_t until = server.completions_answered() + static_cast<uint64_t>(requests);
  while (Clock::now() < end && (requests == 0 || server.completions_answered() < until)) {
    const timespec poll{0, 20'000'000};  // 20 ms: how late the window may close after its last request
    const int received = sigtimedwait(&signals, nullptr, &poll);
    if (received > 0) return received;
  }
  return 0;
}

void run_serve(const ServeCliOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  // SIGINT and SIGTERM go to this thread's sigwait only: blocked before any thread starts (threads inherit it).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  serve::Server server(o.server);
  server.start();
  std::cerr << "microllm serve: model " << server.model_name() << " on http://" << o.server.host << ":"
            << server.port() << " (POST /v1/completions, /v1/chat/completions; GET /v1/models, /health, /metrics)"
            << std::endl;
  int received = 0;
  if (!o.trace.empty()) {  // the trace's window: until it ends or a signal comes, whichever is first
    const double seconds = o.trace_seconds > 0 || o.trace_requests > 0 ? o.trace_seconds : 10;
    TraceFile trace(o.trace);
    std::cerr << "microllm serve: tracing into " << o.trace << " for "
              << (o.trace_requests > 0 ? str_cat(o.trace_requests, " requests") : "")
              << (o.trace_requests > 0 && seconds > 0 ? " or " : "") << (seconds > 0 ? str_cat(seconds, " s") : "")
              << std::endl;
    received = wait_for_trace_window(server, signals, seconds, o.trace_requests);
    trace.finish();
  }
  if (received <= 0) sigwait(&signals, &received);
  std::cerr << "microllm serve: " << (received == SIGINT ? "SIGINT" : "SIGTERM") << ", stopping" << std::endl;
  server.stop();
}

}  // namespace

void register_serve(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over HTTP with the OpenAI API (completions, chat)");
  auto o = std::make_shared<ServeCliOptions>();
  cmd->add_option("-m,--model", o->server.model_dir, "Model directory: Hugging Face or a microllm checkpoint")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--model-name", o->server.model_name, "The model's id in the API (default: the directory's name)");
  cmd->add_option("--host", o->server.host, "Address to listen on")->capture_default_str();
  cmd->add_option("-p,--port", o->server.port, "TCP port (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--device", o->server.device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", o->server.dtype, "Weights and compute: f32 or bf16 (f64 too on the CPU)")
      ->capture_default_str();
  cmd->add_option("--max-batch", o->server.max_batch, "Sequences decoded together at most (continuous batching)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--kv-blocks", o->server.kv_blocks,
                  "KV cache blocks of 16 tokens (0: half the free GPU memory; on the CPU up to 1 GiB)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", o->server.prefill_chunk,
                  "Prompt tokens prefilled per engine step (more: long prompts sooner; fewer: shorter stalls for "
                  "running requests)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", o->server.max_body_bytes, "Larger request bodies get 413")->capture_default_str();
  cmd->add_option("--api-key", o->server.api_key, "Require 'Authorization: Bearer KEY' on /v1/*");
  cmd->add_option("--default-max-tokens", o->server.default_max_tokens, "Chat completions without max_tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--http-threads", o->server.http_threads, "Connections served at once")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads for the model (0: all)");
  add_trace_option(cmd, o->trace);
  cmd->add_option("--trace-seconds", o->trace_seconds,
                  "With --trace: the trace's window from the start, in seconds (default 10 without --trace-requests)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--trace-requests", o->trace_requests,
                  "With --trace: end the trace once this many completion requests have been answered")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--cors", o->server.cors_origins,
                  "Allow pages from these origins to call the API (CORS); --cors alone: any origin (*)")
      ->expected(0, CLI::detail::expected_max_vector_size)
      ->default_str("*");
  cmd->callback([o] { run_serve(*o); });
}

}  // namespace microllm::app
