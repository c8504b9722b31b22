// The one place the backends read the environment (environment.h says what each variable means).
#include "environment.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "microllm/core/error.h"

namespace microllm::detail {
namespace {

struct PathEntry {
  const char* name;
  const char* replaced;  // the variable the name replaced: setting it is an error naming the name
};

constexpr PathEntry kPaths[] = {
#define MICROLLM_FAST_PATH_ENTRY(id, name, replaced, turns_off) {name, replaced},
    MICROLLM_DISABLE_PATHS(MICROLLM_FAST_PATH_ENTRY)
#undef MICROLLM_FAST_PATH_ENTRY
};
constexpr int kPathCount = static_cast<int>(sizeof(kPaths) / sizeof(kPaths[0]));
static_assert(kPathCount <= 32, "FastPathSet holds a bit per path");

constexpr const char* kDisable = "MICROLLM_DISABLE";

std::string_view trimmed(std::string_view s) {
  const size_t first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

std::string known_names() {
  std::string names;
  for (const PathEntry& p : kPaths) names += str_cat(names.empty() ? "" : ", ", p.name);
  return names;
}

FastPathSet disabled_paths() {
  static const FastPathSet paths = [] {
    for (const PathEntry& p : kPaths) {
      if (std::getenv(p.replaced) != nullptr) {
        throw ValueError("backend", str_cat(p.replaced, " was replaced by ", kDisable, "=", p.name,
                                            " (docs/CUDA.md, \"Switches\"); unset it"));
      }
    }
    const char* env = std::getenv(kDisable);
    return env == nullptr ? FastPathSet{0} : parse_disabled_paths(env);
  }();
  return paths;
}

}  // namespace

const char* path_name(FastPath path) { return kPaths[static_cast<int>(path)].name; }

FastPathSet parse_disabled_paths(std::string_view value) {
  FastPathSet set = 0;
  while (true) {
    const size_t comma = value.find(',');
    const std::string_view name = trimmed(value.substr(0, comma));
    if (!name.empty()) {
      int i = 0;
      while (i < kPathCount && name != kPaths[i].name) ++i;
      if (i == kPathCount) {
        throw ValueError("backend",
                         str_cat(kDisable, " names an unknown path \"", name, "\"; the paths are ", known_names()));
      }
      set |= path_bit(static_cast<FastPath>(i));
    }
    if (comma == std::string_view::npos) return set;
    value.remove_prefix(comma + 1);
  }
}

bool path_disabled(FastPath path) { return (disabled_paths() & path_bit(path)) != 0; }

bool deterministic_from_environment() { return switch_from_environment("MICROLLM_DETERMINISTIC"); }

int attention_o_replicas_from_environment() {
  return count_from_environment("MICROLLM_ATTENTION_O_REPLICAS", 1, kMaxAttentionOReplicas);
}

void check_environment() {
  disabled_paths();
  deterministic_from_environment();
  attention_o_replicas_from_environment();
}

bool switch_from_environment(const char* name) {
  const char* env = std::getenv(name);
  if (env == nullptr || std::strcmp(env, "1") == 0) return true;
  if (std::strcmp(env, "0") == 0) return false;
  throw ValueError("backend", str_cat(name, " must be 0 or 1, got \"", env, "\""));
}

int count_from_environment(const char* name, int lo, int hi) {
  const char* env = std::getenv(name);
  if (env == nullptr) return 0;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(env, &end, 10);
  if (end == env || *end != '\0' || errno != 0 || value < lo || value > hi) {
    throw ValueError("backend", str_cat(name, " must be a whole number in [", lo, ", ", hi, "], got \"", env, "\""));
  }
  return static_cast<int>(value);
}

}  // namespace microllm::detail
