// The kernel-choice record (microllm/backend/kernel_choices.h).
#include "microllm/backend/kernel_choices.h"

#include <algorithm>
#include <atomic>
#include <mutex>

namespace microllm {
namespace {

std::atomic<bool> g_recording{false};

struct Record {
  std::mutex mutex;
  std::vector<KernelChoice> choices;
};
Record& record() {
  static Record r;
  return r;
}

}  // namespace

void set_recording_kernel_choices(bool on) { g_recording.store(on, std::memory_order_relaxed); }
bool recording_kernel_choices() { return g_recording.load(std::memory_order_relaxed); }

void record_kernel_choice(std::string_view op, std::string_view shapes, std::string_view choice) {
  if (!recording_kernel_choices()) return;
  Record& r = record();
  const std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = std::find_if(r.choices.begin(), r.choices.end(), [&](const KernelChoice& c) {
    return c.op == op && c.shapes == shapes && c.choice == choice;
  });
  if (it != r.choices.end()) {
    ++it->calls;
    return;
  }
  r.choices.push_back({std::string(op), std::string(shapes), std::string(choice), 1});
}

std::vector<KernelChoice> kernel_choices() {
  Record& r = record();
  const std::lock_guard<std::mutex> lock(r.mutex);
  return r.choices;
}

void clear_kernel_choices() {
  Record& r = record();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.choices.clear();
}

}  // namespace microllm
