#include "serve/connection.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <filesystem>

namespace microllm::serve {

namespace {

// A socket address as numeric host and port (getnameinfo, as cpp-httplib writes Request::remote_addr).
bool numeric(const sockaddr_storage& address, socklen_t length, std::string& host, int& port) {
  char host_text[NI_MAXHOST], port_text[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host_text, sizeof host_text, port_text,
                  sizeof port_text, NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return false;
  }
  host = host_text;
  port = std::atoi(port_text);
  return true;
}

bool is_connection(int fd, const std::string& local_addr, int local_port, const std::string& remote_addr,
                   int remote_port) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  std::string host;
  int port = -1;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
      !numeric(address, length, host, port) || host != remote_addr || port != remote_port) {
    return false;
  }
  length = sizeof address;
  return getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0 &&
         numeric(address, length, host, port) && host == local_addr && port == local_port;
}

}  // namespace

std::optional<PeerWatch> PeerWatch::find(const std::string& local_addr, int local_port, const std::string& remote_addr,
                                         int remote_port) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", error)) {
    char* end = nullptr;
    const std::string name = entry.path().filename().string();
    const long fd = std::strtol(name.c_str(), &end, 10);
    if (end == name.c_str() || *end != '\0') continue;
    if (is_connection(static_cast<int>(fd), local_addr, local_port, remote_addr, remote_port)) {
      return PeerWatch(static_cast<int>(fd));
    }
  }
  return std::nullopt;
}

bool PeerWatch::closed() const {
  pollfd p{fd_, POLLRDHUP, 0};
  if (poll(&p, 1, 0) < 0) return false;  // interrupted: ask again next time
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace microllm::serve
