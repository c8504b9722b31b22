// Token ids given on the command line (`logits --ids`, `attention --ids`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace microllm::app {

// "1,2,3;4,5,6" -> {{1, 2, 3}, {4, 5, 6}}; every sequence must have the same, nonzero length (ValueError naming
// `command` and the item otherwise).
std::vector<std::vector<int64_t>> parse_id_rows(const std::string& text, const char* command);

}  // namespace microllm::app
