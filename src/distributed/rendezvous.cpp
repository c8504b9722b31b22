// Where this process sits in the job (the launcher's environment), and the one TCP exchange NCCL needs:
// rank 0's unique id sent to every other rank. Nothing else travels over these sockets.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "microllm/distributed/communicator.h"

namespace microllm::distributed {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

int env_int(const char* name, int fallback) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  const long value = std::strtol(v, &end, 10);
  MICROLLM_CHECK(end != v && *end == '\0' && value >= 0 && value < (1L << 30), ValueError, "distributed",
                 "environment variable ", name, "='", v, "' is not a non-negative integer");
  return static_cast<int>(value);
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A socket closed by its scope.
class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Waits until fd is readable/writable or the deadline passes (an error naming `what`).
void wait_fd(int fd, short events, Clock::time_point start, double timeout, const std::string& what) {
  while (true) {
    const double left = timeout - seconds_since(start);
    MICROLLM_CHECK(left > 0, BackendError, "rendezvous", "timed out after ", timeout, " s ", what);
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min(left, 1.0) * 1000) + 1);
    if (r > 0) return;
    MICROLLM_CHECK(r == 0 || errno == EINTR, BackendError, "rendezvous", "poll failed ", what, ": ",
                   std::strerror(errno));
  }
}

void send_all(int fd, const void* data, size_t n, Clock::time_point start, double timeout, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    wait_fd(fd, POLLOUT, start, timeout, what);
    const ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL);
    if (sent < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    MICROLLM_CHECK(sent > 0, BackendError, "rendezvous", "send failed ", what, ": ", std::strerror(errno));
    p += sent;
    n -= static_cast<size_t>(sent);
  }
}

void recv_all(int fd, void* data, size_t n, Clock::time_point start, double timeout, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    wait_fd(fd, POLLIN, start, timeout, what);
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    MICROLLM_CHECK(got > 0, BackendError, "rendezvous", got == 0 ? "the peer closed the connection " : "recv failed ",
                   what, got == 0 ? "" : ": ", got == 0 ? "" : std::strerror(errno));
    p += got;
    n -= static_cast<size_t>(got);
  }
}

constexpr uint32_t kMagic = 0x4d4c4c4d;  // "MLLM"

}  // namespace

LaunchInfo detect_launch() {
  LaunchInfo info;
  if (env("OMPI_COMM_WORLD_SIZE") != nullptr) {
    info.launcher = "mpirun";
    info.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    info.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    info.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    info.local_world_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  } else if (env("WORLD_SIZE") != nullptr || env("RANK") != nullptr) {
    info.launcher = "env";
    info.rank = env_int("RANK", 0);
    info.world_size = env_int("WORLD_SIZE", 1);
    info.local_rank = env_int("LOCAL_RANK", 0);
    info.local_world_size = env_int("LOCAL_WORLD_SIZE", info.world_size);
  } else if (env("SLURM_NTASKS") != nullptr && env("SLURM_PROCID") != nullptr) {
    info.launcher = "env";
    info.rank = env_int("SLURM_PROCID", 0);
    info.world_size = env_int("SLURM_NTASKS", 1);
    info.local_rank = env_int("SLURM_LOCALID", 0);
    // SLURM_NTASKS_PER_NODE may read "8(x2)": its leading number is the count per node.
    const char* per_node = env("SLURM_NTASKS_PER_NODE");
    info.local_world_size = per_node != nullptr ? std::max(1, std::atoi(per_node)) : 1;
  }
  if (const char* addr = env("MASTER_ADDR")) info.master_addr = addr;
  info.master_port = env_int("MASTER_PORT", info.master_port);
  // Under torchrun the agent's own store listens on MASTER_PORT; the rendezvous takes the next port.
  if (const char* agent = env("TORCHELASTIC_USE_AGENT_STORE"); agent != nullptr && std::string(agent) == "True") {
    info.master_port += 1;
  }
  MICROLLM_CHECK(info.world_size >= 1 && info.rank < info.world_size, ValueError, "distributed", "rank ", info.rank,
                 " is not below the world size ", info.world_size, " (launcher: ", info.launcher, ")");
  MICROLLM_CHECK(info.master_port > 0 && info.master_port < 65536, ValueError, "distributed", "MASTER_PORT ",
                 info.master_port, " is not a TCP port");
  return info;
}

std::string tcp_broadcast(const std::string& bytes, const LaunchInfo& launch, double timeout_seconds) {
  if (launch.world_size == 1) return bytes;
  const auto start = Clock::now();
  const std::string where = str_cat(launch.master_addr, ":", launch.master_port);
  if (launch.rank == 0) {
    Socket listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    MICROLLM_CHECK(listener.fd() >= 0, BackendError, "rendezvous", "socket failed: ", std::strerror(errno));
    const int one = 1;
    ::setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(launch.master_port));
    MICROLLM_CHECK(::bind(listener.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0, BackendError,
                   "rendezvous", "rank 0 cannot listen on port ", launch.master_port, ": ", std::strerror(errno),
                   " (set MASTER_PORT to a free port)");
    MICROLLM_CHECK(::listen(listener.fd(), launch.world_size) == 0, BackendError, "rendezvous", "listen failed: ",
                   std::strerror(errno));
    for (int joined = 1; joined < launch.world_size; ++joined) {
      wait_fd(listener.fd(), POLLIN, start, timeout_seconds,
              str_cat("waiting on port ", launch.master_port, " for rank connections (", joined, " of ",
                      launch.world_size, " ranks joined)"));
      Socket peer(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
      if (peer.fd() < 0) {
        --joined;
        continue;
      }
      uint32_t hello[2] = {};  // magic, the peer's rank
      recv_all(peer.fd(), hello, sizeof(hello), start, timeout_seconds, "reading a peer's greeting");
      MICROLLM_CHECK(hello[0] == kMagic, BackendError, "rendezvous", "a connection to port ", launch.master_port,
                     " is not a microLLM rank (another program uses MASTER_PORT?)");
      const uint64_t n = bytes.size();
      send_all(peer.fd(), &n, sizeof(n), start, timeout_seconds, str_cat("to rank ", hello[1]));
      send_all(peer.fd(), bytes.data(), bytes.size(), start, timeout_seconds, str_cat("to rank ", hello[1]));
    }
    return bytes;
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(launch.master_port);
  const int gai = ::getaddrinfo(launch.master_addr.c_str(), port.c_str(), &hints, &found);
  MICROLLM_CHECK(gai == 0 && found != nullptr, BackendError, "rendezvous", "cannot resolve MASTER_ADDR ",
                 launch.master_addr, ": ", ::gai_strerror(gai));
  sockaddr_in target{};
  std::memcpy(&target, found->ai_addr, sizeof(target));
  ::freeaddrinfo(found);
  while (true) {  // rank 0 may not listen yet: retry until the timeout
    Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    MICROLLM_CHECK(s.fd() >= 0, BackendError, "rendezvous", "socket failed: ", std::strerror(errno));
    if (::connect(s.fd(), reinterpret_cast<sockaddr*>(&target), sizeof(target)) == 0) {
      const uint32_t hello[2] = {kMagic, static_cast<uint32_t>(launch.rank)};
      send_all(s.fd(), hello, sizeof(hello), start, timeout_seconds, str_cat("to rank 0 at ", where));
      uint64_t n = 0;
      recv_all(s.fd(), &n, sizeof(n), start, timeout_seconds, str_cat("from rank 0 at ", where));
      MICROLLM_CHECK(n < (1u << 20), BackendError, "rendezvous", "rank 0 at ", where, " announced ", n, " bytes");
      std::string out(n, '\0');
      recv_all(s.fd(), out.data(), n, start, timeout_seconds, str_cat("from rank 0 at ", where));
      return out;
    }
    MICROLLM_CHECK(seconds_since(start) < timeout_seconds, BackendError, "rendezvous", "rank ", launch.rank,
                   " could not reach rank 0 at ", where, " within ", timeout_seconds, " s: ", std::strerror(errno));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace microllm::distributed
