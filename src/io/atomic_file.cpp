#include "microllm/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "microllm/core/error.h"

namespace microllm::io {
namespace {
std::atomic<uint64_t> g_temp_counter{0};

std::string errno_text() { return std::strerror(errno); }
}  // namespace

void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t written = ::write(fd, bytes, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      throw IoError(path, str_cat("write failed: ", errno_text()));
    }
    bytes += written;
    size -= static_cast<size_t>(written);
  }
}

void sync_directory(const std::string& directory) {
  const int fd = ::open(directory.empty() ? "." : directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw IoError(directory, str_cat("cannot open the directory to sync it: ", errno_text()));
  const int status = ::fsync(fd);
  ::close(fd);
  if (status != 0) throw IoError(directory, str_cat("fsync of the directory failed: ", errno_text()));
}

void write_file_atomically(const std::string& path, const std::function<void(int fd)>& write) {
  const std::filesystem::path target(path);
  const std::string temp = str_cat(path, ".tmp.", ::getpid(), ".", g_temp_counter++);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(path, str_cat("cannot create ", temp, ": ", errno_text()));
  try {
    write(fd);
    if (::fsync(fd) != 0) throw IoError(path, str_cat("fsync failed: ", errno_text()));
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(temp.c_str());
    throw IoError(path, str_cat("close failed: ", errno_text()));
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(temp.c_str());
    throw IoError(path, str_cat("rename from ", temp, " failed: ", why));
  }
  sync_directory(target.has_parent_path() ? target.parent_path().string() : ".");
}

void write_text_atomically(const std::string& path, std::string_view text) {
  write_file_atomically(path, [&](int fd) { write_all(fd, text.data(), text.size(), path); });
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(path, "cannot open the file");
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace microllm::io
