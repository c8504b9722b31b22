// Per-op GPU timing. When on, the CUDA backend brackets every op's kernels with CUDA events;
// op_timings() waits for them and sums the time per op. Off by default: events cost a little.
// (Every CUDA op is also an NVTX range named after it, for Nsight, whether timing is on or not.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace microllm {

struct OpTiming {
  std::string op;
  int64_t calls = 0;
  double total_ms = 0;
};

void set_op_timing(bool on);
bool op_timing_enabled();
// Totals per op since the last reset, slowest first. Synchronizes with the pending events.
std::vector<OpTiming> op_timings();
void reset_op_timings();

}  // namespace microllm
