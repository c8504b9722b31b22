// Tracing: named spans of work on the host, and on the GPU (CUDA events recorded around each op and resolved to
// times only when the trace ends, so tracing adds no host wait), with counters (bytes in use, KV blocks, batch
// size), collected by one process-wide session and written as Chrome trace-event JSON, which ui.perfetto.dev and
// chrome://tracing open. Spans nest per thread (a layer inside a step, an op inside a layer); every span is an
// NVTX range of the same name in CUDA builds too, so Nsight Systems shows them. Off by default: a Scope then costs
// one relaxed atomic load.
//
//   profile::start();
//   { profile::Scope step("train.step", "step"); ... }   // spans: any thread, nested
//   profile::counter("kv_blocks_used", 42);
//   profile::Trace trace = profile::stop();
//   trace.write("run.trace.json");                      // atomically
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace microllm::profile {

// One event of a trace, in Chrome's trace-event terms: a complete span ('X'), a counter sample ('C'), or a
// thread's name ('M'). Times in microseconds since the session started.
struct Event {
  char phase = 'X';
  std::string name, category;
  double ts_us = 0, dur_us = 0;
  int pid = 0;  // 0: the host process; 1 + N: CUDA device N
  int64_t tid = 0;
  std::vector<std::pair<std::string, double>> args;  // a counter's values; a span's numbers (bytes, tokens, ...)
};

struct Trace {
  std::vector<Event> events;  // ordered by start time
  // {"traceEvents": [...], "displayTimeUnit": "ms"}, with process and thread names.
  std::string to_chrome_json() const;
  // Writes to_chrome_json() to `path` (into a temporary file renamed when complete).
  void write(const std::string& path) const;
  // Reads a trace written by write() (or any Chrome trace-event JSON): ParseError naming the file otherwise.
  static Trace read(const std::string& path);
};

// Whether a session is collecting. Relaxed: a span that starts as a session starts or stops may be kept or not.
bool tracing();
// Starts a session (clearing what an earlier one left). ValueError when one is running.
void start();
// Ends the session: every span, GPU spans resolved (this waits for their events), and counters.
Trace stop();

// A host span from construction to destruction on this thread, when tracing (and an NVTX range of the same name in
// CUDA builds, always). Names are formed in a fixed buffer, so a scope costs no allocation when not tracing.
class Scope {
 public:
  Scope(const char* name, const char* category);
  // The name `prefix` + index + `suffix` ("layer." 3 ".mlp"), at most 63 characters.
  Scope(const char* prefix, int64_t index, const char* suffix, const char* category);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  // A number shown with the span (its args), e.g. tokens or rows.
  void arg(const char* name, double value);

 private:
  void begin();
  char name_[64];
  const char* category_;
  bool active_ = false;
  int64_t start_ns_ = 0;
  std::vector<std::pair<std::string, double>> args_;
};

// A counter sample now (Perfetto draws each counter name as a track).
void counter(const char* name, double value);

// A span of a CUDA device's work: events recorded on the device's current stream at construction and at
// destruction, resolved to times when the session stops (so the host never waits for them). Not on a stream that
// a CUDA graph capture is recording (a graph's replay is spanned whole by its caller) nor when not tracing or
// device < 0 (the CPU). The first span of a session on a device synchronizes that device once, to align its clock
// with the host's.
class GpuScope {
 public:
  GpuScope(const char* name, const char* category, int device);
  GpuScope(const char* prefix, int64_t index, const char* suffix, const char* category, int device);
  ~GpuScope();
  GpuScope(const GpuScope&) = delete;
  GpuScope& operator=(const GpuScope&) = delete;

 private:
  void begin(std::string name, const char* category, int device);
  struct Recording;
  std::unique_ptr<Recording> recording_;
};

// Microseconds since the session started, on the host clock.
double now_us();

}  // namespace microllm::profile
