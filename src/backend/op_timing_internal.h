// How a backend reports one timed op (internal header): `elapsed_ms` is called later, by op_timings(),
// and may block until the op's kernels finished.
#pragma once

#include <functional>
#include <string>

namespace microllm::detail {

void record_op_time(const char* op, std::function<double()> elapsed_ms);

}  // namespace microllm::detail
