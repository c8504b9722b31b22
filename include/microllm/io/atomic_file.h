// Writing files so that a crash never leaves a half-written file where a good one was: write a
// temporary next to the target, fsync it, rename it over the target, fsync the directory.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace microllm::io {

// Calls write(fd) to fill a temporary file, then publishes it as `path`. Throws IoError naming the path.
void write_file_atomically(const std::string& path, const std::function<void(int fd)>& write);
void write_text_atomically(const std::string& path, std::string_view text);
// Writes all of `data` to `fd`, retrying short writes; throws IoError naming `path`.
void write_all(int fd, const void* data, size_t size, const std::string& path);
// fsync of a directory, so a rename inside it is durable.
void sync_directory(const std::string& directory);
std::string read_text_file(const std::string& path);

}  // namespace microllm::io
