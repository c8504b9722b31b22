// Settings the backends read from the environment: the A/B switches of docs/perf (MICROLLM_GEMV,
// MICROLLM_ATTENTION_O, ...), each read once by its user. Internal header.
#pragma once

namespace microllm::detail {

// Unset or "1": true; "0": false; anything else is a configuration mistake: ValueError naming the variable.
bool switch_from_environment(const char* name);

// Unset: 0; else a whole number in [lo, hi] (lo >= 1); anything else: ValueError naming the variable and range.
int count_from_environment(const char* name, int lo, int hi);

}  // namespace microllm::detail
