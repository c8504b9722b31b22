#include "token_ids.h"

#include <sstream>

#include "microllm/core/error.h"

namespace microllm::app {

std::vector<std::vector<int64_t>> parse_id_rows(const std::string& text, const char* command) {
  std::vector<std::vector<int64_t>> rows;
  std::stringstream rows_in(text);
  std::string row;
  while (std::getline(rows_in, row, ';')) {
    std::vector<int64_t> ids;
    std::stringstream ids_in(row);
    std::string item;
    while (std::getline(ids_in, item, ',')) {
      const size_t begin = item.find_first_not_of(" \t\n");
      if (begin == std::string::npos) continue;
      size_t used = 0;
      int64_t id = 0;
      try {
        id = std::stoll(item.substr(begin), &used);
      } catch (const std::exception&) {
        used = 0;
      }
      const std::string rest = item.substr(begin + used);
      MICROLLM_CHECK(used > 0 && rest.find_first_not_of(" \t\n") == std::string::npos, ValueError, command, "--ids: '",
                     item, "' is not an integer");
      ids.push_back(id);
    }
    MICROLLM_CHECK(!ids.empty(), ValueError, command, "--ids: sequence ", rows.size(), " is empty");
    rows.push_back(std::move(ids));
  }
  MICROLLM_CHECK(!rows.empty(), ValueError, command, "--ids holds no sequence");
  for (size_t i = 1; i < rows.size(); ++i) {
    MICROLLM_CHECK(rows[i].size() == rows[0].size(), ValueError, command, "--ids: sequence ", i, " has ",
                   rows[i].size(), " ids, sequence 0 has ", rows[0].size(), " (all must have the same length)");
  }
  return rows;
}

}  // namespace microllm::app
