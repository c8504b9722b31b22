// An OpenAI-compatible HTTP server over one model: `microllm serve` and in-process use (tests, embedding).
//
//   serve::ServerOptions options;
//   options.model_dir = "models/Qwen2.5-0.5B-Instruct";
//   options.port = 8080;                       // 0: any free port (see port())
//   serve::Server server(options);             // loads the model and the tokenizer
//   server.start();                            // listens; HTTP and scheduler threads run in the background
//   server.wait();                             // until stop() from another thread
//
// Endpoints: GET /v1/models and /v1/models/{id}, POST /v1/completions, POST /v1/chat/completions (stream
// false, or true as server-sent events ending with `data: [DONE]`), GET /health, GET /metrics (Prometheus
// text). Errors are OpenAI error objects {"error": {"message", "type", "param", "code"}} with a 4xx/5xx status;
// a request field the server does not honour is a 400 naming it (docs/SERVING.md lists every field).
//
// One scheduler thread runs a generate::Engine (continuous batching over a paged KV cache): requests join
// the running batch as soon as a row and KV blocks are free and leave it when they finish, each with its own
// sampling parameters and seed (a seed gives the same text whatever else runs). A request whose prompt and
// max_tokens need more KV blocks than the cache has gets a 400. A client that disconnects, streaming or not,
// frees its row and blocks at the engine's next step.
// The HTTP library is private to the implementation: this header needs only the standard library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace microllm::serve {

struct ServerOptions {
  std::string model_dir;            // a Hugging Face model directory or a microllm checkpoint
  std::string model_name;           // the id in /v1/models and responses; empty: the directory's name
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0-65535; 0: an ephemeral port
  std::string device = "cpu";       // cpu, cuda, cuda:N
  std::string dtype = "f32";        // weights and compute: f32 or bf16 (f64 too on the CPU)
  int max_batch = 8;                // sequences decoded together at most (the engine's rows)
  int64_t kv_blocks = 0;            // KV cache blocks of 16 tokens; 0: the engine's default (EngineOptions)
  int64_t prefill_chunk = 512;      // prompt tokens per engine step: more prefill long prompts faster, fewer keep
                                    // the running requests' gaps between tokens shorter
  size_t max_body_bytes = 1 << 20;  // larger request bodies get 413
  std::string api_key;              // non-empty: /v1/* need "Authorization: Bearer <api_key>"
  int64_t default_max_tokens = 256; // chat completions without max_tokens (completions default to 16, as OpenAI)
  int http_threads = 16;            // connections served at once (more wait in the accept queue)
  // CORS: origins whose pages may call the API ("*": any); empty: no CORS headers, OPTIONS is not answered.
  std::vector<std::string> cors_origins;
};

class Server {
 public:
  // Loads the model and the tokenizer (microllm::Error when they cannot be loaded or an option is out of range).
  explicit Server(ServerOptions options);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port and starts serving in background threads; IoError when the address cannot be bound (a port
  // another server listens on: "address already in use").
  void start();
  // Blocks until stop() is called (from another thread).
  void wait();
  // Stops accepting, cancels queued and running requests, joins the threads. Idempotent.
  void stop();

  int port() const;  // the bound port (after start())
  const std::string& model_name() const;
  std::string metrics_text() const;  // what GET /metrics returns
  // Completion and chat completion requests answered so far, whatever their status (streams when they end).
  uint64_t completions_answered() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace microllm::serve
