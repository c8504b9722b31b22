// Noticing that the client of a request has gone while its handler waits (a non-streaming completion that is
// still generating): cpp-httplib gives a handler its request but not its socket, so the socket is found among
// the process's open descriptors by the connection's address pair (local and remote address and port), which
// identify it. The descriptor stays open while the handler runs (the library closes it after the handler
// returns), so the watch is valid for as long as the handler uses it. Private to the serve layer.
#pragma once

#include <optional>
#include <string>

namespace microllm::serve {

class PeerWatch {
 public:
  // The accepted socket of the connection local_addr:local_port <- remote_addr:remote_port (numeric addresses,
  // as cpp-httplib's Request holds them); nullopt when no open descriptor matches.
  static std::optional<PeerWatch> find(const std::string& local_addr, int local_port, const std::string& remote_addr,
                                       int remote_port);

  // Whether the client has closed the connection (or it failed): the peer's end-of-stream or an error, seen
  // without reading or blocking. A client that only half-closes (shuts down its sending side while it waits
  // for the answer) looks the same; HTTP clients do not do that.
  bool closed() const;

  int descriptor() const { return fd_; }

 private:
  explicit PeerWatch(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace microllm::serve
