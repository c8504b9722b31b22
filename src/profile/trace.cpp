#include "microllm/profile/trace.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#ifdef MICROLLM_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

#include "microllm/core/cuda.h"
#include "microllm/core/error.h"
#include "microllm/core/memory.h"

namespace microllm::profile {

namespace {

using Clock = std::chrono::steady_clock;

// The spans a thread ended during the session: appended without a lock by their thread, collected at stop().
struct ThreadBuffer {
  int64_t tid = 0;
  std::mutex m;  // uncontended but for stop(), which may collect while the thread ends a span
  std::vector<Event> events;
};

// A device's clock origin in the session: an event recorded after a device synchronization, at host time us.
struct GpuReference {
  std::shared_ptr<cuda::Event> event;
  double us = 0;
};

struct GpuSpan {
  int device;
  int64_t stream;
  std::string name;
  const char* category;
  std::shared_ptr<cuda::Event> start, end;
};

struct Session {
  std::atomic<bool> on{false};
  std::atomic<uint64_t> generation{0};  // which session a thread's buffer belongs to
  Clock::time_point start;
  std::mutex m;  // guards the members below
  std::vector<std::shared_ptr<ThreadBuffer>> threads;
  std::vector<GpuSpan> gpu_spans;
  std::map<int, GpuReference> gpu_references;
  std::map<std::pair<int, void*>, int64_t> streams;  // (device, stream) -> its track's number
  std::vector<Event> counters;
  std::vector<Device> devices;                     // the CPU and the CUDA devices, for memory samples
  std::map<std::string, int64_t> memory_sampled;  // device -> the live total of its last memory sample
};

Session& session() {
  static Session s;
  return s;
}

std::atomic<int64_t> g_next_tid{1};

// This thread's buffer in the current session (registered on first use).
ThreadBuffer& thread_buffer() {
  thread_local std::shared_ptr<ThreadBuffer> buffer;
  thread_local uint64_t generation = 0;
  thread_local const int64_t tid = g_next_tid.fetch_add(1);
  Session& s = session();
  const uint64_t current = s.generation.load(std::memory_order_acquire);
  if (!buffer || generation != current) {
    buffer = std::make_shared<ThreadBuffer>();
    buffer->tid = tid;
    generation = current;
    std::lock_guard lock(s.m);
    s.threads.push_back(buffer);
  }
  return *buffer;
}

int64_t ns_since_start(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t - session().start).count();
}

std::vector<Device> memory_devices() {
  std::vector<Device> devices{Device::cpu()};
  for (int i = 0; i < cuda_device_count(); ++i) devices.push_back(Device::cuda(i));
  return devices;
}

// A counter event of bytes by category, in MiB.
Event memory_event(const std::string& name, double ts, const std::array<int64_t, kMemoryCategories>& bytes) {
  Event e{'C', name, "memory", ts, 0, 0, 0, {}};
  for (int c = 0; c < kMemoryCategories; ++c) {
    e.args.emplace_back(memory_category_name(static_cast<MemoryCategory>(c)),
                        static_cast<double>(bytes[static_cast<size_t>(c)]) / (1024.0 * 1024.0));
  }
  return e;
}

// Samples each device whose live total changed since its last sample. Holds s.m.
void sample_memory_locked(Session& s, double ts) {
  for (const Device device : s.devices) {
    const MemoryUsage usage = memory_usage(device);
    const std::string name = "memory " + device.str();
    const auto [it, fresh] = s.memory_sampled.try_emplace(name, -1);
    if (it->second == usage.total || (fresh && usage.total == 0)) continue;
    it->second = usage.total;
    s.counters.push_back(memory_event(name, ts, usage.live));
  }
}

}  // namespace

bool tracing() { return session().on.load(std::memory_order_relaxed); }

double now_us() { return static_cast<double>(ns_since_start(Clock::now())) / 1000.0; }

void start() {
  Session& s = session();
  std::lock_guard lock(s.m);
  MICROLLM_CHECK(!s.on.load(), ValueError, "trace", "a trace session is running already");
  s.threads.clear();
  s.gpu_spans.clear();
  s.gpu_references.clear();
  s.streams.clear();
  s.counters.clear();
  s.memory_sampled.clear();
  s.devices = memory_devices();
  for (const Device device : s.devices) reset_memory_peak(device);  // the peak becomes the session's
  s.start = Clock::now();
  s.generation.fetch_add(1, std::memory_order_release);
  s.on.store(true, std::memory_order_release);
}

Trace stop() {
  Session& s = session();
  Trace trace;
  std::vector<GpuSpan> gpu;
  std::map<int, GpuReference> references;
  {
    std::lock_guard lock(s.m);
    MICROLLM_CHECK(s.on.load(), ValueError, "trace", "no trace session is running");
    s.on.store(false, std::memory_order_release);
    const double end = now_us();
    sample_memory_locked(s, end);
    for (const Device device : s.devices) {
      const MemoryUsage usage = memory_usage(device);
      if (usage.peak > 0) s.counters.push_back(memory_event("memory peak " + device.str(), end, usage.at_peak));
    }
    for (const auto& thread : s.threads) {
      std::lock_guard thread_lock(thread->m);
      trace.events.insert(trace.events.end(), thread->events.begin(), thread->events.end());
    }
    trace.events.insert(trace.events.end(), s.counters.begin(), s.counters.end());
    gpu.swap(s.gpu_spans);
    references.swap(s.gpu_references);
  }
  for (GpuSpan& span : gpu) {  // waits for each span's events: the GPU's work is resolved only now
    const GpuReference& ref = references.at(span.device);
    span.end->synchronize();
    const double start = cuda::Event::elapsed_ms(*ref.event, *span.start);
    const double end = cuda::Event::elapsed_ms(*ref.event, *span.end);
    trace.events.push_back(Event{'X', std::move(span.name), span.category, ref.us + 1000.0 * start,
                                 1000.0 * (end - start), 1 + span.device, span.stream, {}});
  }
  std::stable_sort(trace.events.begin(), trace.events.end(),
                   [](const Event& a, const Event& b) { return a.ts_us < b.ts_us; });
  return trace;
}

namespace {

// prefix + index + suffix into out[64], cut at 63 characters.
void format_name(char (&out)[64], const char* prefix, int64_t index, const char* suffix) {
  std::snprintf(out, sizeof out, "%s%lld%s", prefix, static_cast<long long>(index), suffix);
}

}  // namespace

Scope::Scope(const char* name, const char* category) : category_(category) {
  std::snprintf(name_, sizeof name_, "%s", name);
  begin();
}

Scope::Scope(const char* prefix, int64_t index, const char* suffix, const char* category) : category_(category) {
  format_name(name_, prefix, index, suffix);
  begin();
}

void Scope::begin() {
#ifdef MICROLLM_WITH_CUDA
  nvtxRangePushA(name_);
#endif
  if (!tracing()) return;
  active_ = true;
  start_ns_ = ns_since_start(Clock::now());
}

void Scope::arg(const char* name, double value) {
  if (active_) args_.emplace_back(name, value);
}

Scope::~Scope() {
#ifdef MICROLLM_WITH_CUDA
  nvtxRangePop();
#endif
  if (!active_ || !tracing()) return;
  const int64_t end_ns = ns_since_start(Clock::now());
  ThreadBuffer& buffer = thread_buffer();
  {
    std::lock_guard lock(buffer.m);
    buffer.events.push_back(Event{'X', name_, category_, static_cast<double>(start_ns_) / 1000.0,
                                  static_cast<double>(end_ns - start_ns_) / 1000.0, 0, buffer.tid, std::move(args_)});
  }
  if (std::strcmp(category_, "op") != 0) {  // memory at the end of each layer, step and phase; ops are too many
    Session& s = session();
    std::lock_guard lock(s.m);
    sample_memory_locked(s, static_cast<double>(end_ns) / 1000.0);
  }
}

void counter(const char* name, double value) {
  if (!tracing()) return;
  const double ts = now_us();
  Session& s = session();
  std::lock_guard lock(s.m);
  s.counters.push_back(Event{'C', name, "counter", ts, 0, 0, 0, {{"value", value}}});
}

struct GpuScope::Recording {
  int device;
  cuda::Stream stream;
  std::string name;
  const char* category;
  std::shared_ptr<cuda::Event> start;
};

GpuScope::GpuScope(const char* name, const char* category, int device) {
  if (tracing() && device >= 0) begin(name, category, device);
}

GpuScope::GpuScope(const char* prefix, int64_t index, const char* suffix, const char* category, int device) {
  if (!tracing() || device < 0) return;
  char name[64];
  format_name(name, prefix, index, suffix);
  begin(name, category, device);
}

void GpuScope::begin(std::string name, const char* category, int device) {
  const cuda::Stream stream = cuda::current_stream(device);
  if (stream.capturing()) return;
  Session& s = session();
  {
    std::unique_lock lock(s.m);
    if (!s.gpu_references.count(device)) {  // once a session and device: the device's clock origin
      lock.unlock();
      cuda::synchronize(device);
      auto reference = std::make_shared<cuda::Event>(device);
      reference->record(stream);
      reference->synchronize();
      const double us = now_us();
      lock.lock();
      s.gpu_references.try_emplace(device, GpuReference{std::move(reference), us});
    }
  }
  recording_ = std::make_unique<Recording>(Recording{device, stream, std::move(name), category,
                                                     std::make_shared<cuda::Event>(device)});
  recording_->start->record(stream);
}

GpuScope::~GpuScope() {
  if (!recording_ || !tracing()) return;
  try {
    auto end = std::make_shared<cuda::Event>(recording_->device);
    end->record(recording_->stream);
    Session& s = session();
    std::lock_guard lock(s.m);
    const auto key = std::pair{recording_->device, recording_->stream.handle()};
    const auto [it, fresh] = s.streams.try_emplace(key, static_cast<int64_t>(s.streams.size()));
    s.gpu_spans.push_back(GpuSpan{recording_->device, it->second, std::move(recording_->name), recording_->category,
                                  std::move(recording_->start), std::move(end)});
  } catch (...) {  // a destructor must not throw: the span is dropped
  }
}

}  // namespace microllm::profile
