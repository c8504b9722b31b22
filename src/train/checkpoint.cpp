#include "microllm/train/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "microllm/io/atomic_file.h"
#include "microllm/io/safetensors.h"

namespace microllm::train {

namespace fs = std::filesystem;

namespace {
// Swaps two paths atomically; false when the file system (or kernel) cannot.
bool exchange_paths(const std::string& a, const std::string& b) {
#ifdef RENAME_EXCHANGE
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
    throw IoError(b, str_cat("cannot swap in ", a, ": ", std::strerror(errno)));
  }
#else
  (void)a, (void)b;
#endif
  return false;
}
}  // namespace

void write_directory_atomically(const std::string& dir, const std::function<void(const std::string&)>& fill) {
  fs::path target = fs::path(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "runs/ckpt/" names runs/ckpt
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  fs::create_directories(parent);
  const std::string tmp = str_cat(target.string(), ".tmp-", ::getpid());
  fs::remove_all(tmp);  // the leftover of an earlier crash of this pid
  fs::create_directories(tmp);
  try {
    fill(tmp);
    io::sync_directory(tmp);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
  if (!fs::exists(target)) {
    if (::rename(tmp.c_str(), target.c_str()) != 0) {
      throw IoError(dir, str_cat("cannot rename ", tmp, " into place: ", std::strerror(errno)));
    }
  } else if (exchange_paths(tmp, target.string())) {
    fs::remove_all(tmp);  // now the previous checkpoint
  } else {
    // No atomic exchange here: move the old one aside first; it is removed only once the new one is in place.
    const std::string old = str_cat(target.string(), ".old-", ::getpid());
    fs::remove_all(old);
    if (::rename(target.c_str(), old.c_str()) != 0) {
      throw IoError(dir, str_cat("cannot move the previous checkpoint aside: ", std::strerror(errno)));
    }
    if (::rename(tmp.c_str(), target.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      ::rename(old.c_str(), target.c_str());
      throw IoError(dir, str_cat("cannot rename ", tmp, " into place: ", why));
    }
    fs::remove_all(old);
  }
  io::sync_directory(parent.string());
}

}  // namespace microllm::train
