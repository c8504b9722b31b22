// What a trace says, as tables: the spans that took the most time, the same per layer and per op, and where a
// GPU sat idle while the host was busy with something (the host gaps). `microllm trace summarize FILE` prints it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "microllm/profile/trace.h"

namespace microllm::profile {

struct SpanStats {
  std::string name, category;
  int64_t calls = 0;
  double total_ms = 0, mean_ms = 0, max_ms = 0;
  double share = 0;  // total / the trace's wall time (nested spans each count in full)
};

// An interval in which a GPU ran none of the trace's spans, and the innermost host span open at its middle.
struct GpuGap {
  int device = 0;
  double start_ms = 0, duration_ms = 0;
  std::string host_span;  // "" when no host span covers it
};

struct GpuActivity {
  int device = 0;
  double busy_ms = 0, idle_ms = 0;  // within its first span's start and its last span's end
  std::vector<GpuGap> largest_gaps;  // longest first
};

// A device's memory in the trace (core/memory.h): the breakdown by category when its live total peaked, and how
// many timeline samples the trace holds ("memory <device>" counters, MiB per category).
struct MemoryPeak {
  std::string device;
  double peak_mib = 0;
  std::vector<std::pair<std::string, double>> at_peak_mib;  // category -> MiB
  int64_t samples = 0;
};

struct TraceSummary {
  double wall_ms = 0;  // the first span's start to the last span's end
  std::vector<SpanStats> top, layers, ops;  // by total time, longest first; layers: category "layer", ops: "op"
  std::vector<GpuActivity> gpus;
  std::vector<MemoryPeak> memory;
};

// `rows`: at most this many rows a table (and gaps a device).
TraceSummary summarize(const Trace& trace, size_t rows = 20);
// Markdown tables.
std::string to_markdown(const TraceSummary& summary);

}  // namespace microllm::profile
