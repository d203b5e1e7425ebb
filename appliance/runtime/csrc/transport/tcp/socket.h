// Plain TCP plumbing: listening, connecting with retry until a deadline, socket options.
// Every socket the core opens gets TCP_NODELAY, SO_KEEPALIVE with short probes and
// TCP_USER_TIMEOUT, so a peer whose host vanishes is noticed in seconds even mid-transfer.
//
// IMPLEMENTATION OWNER: see csrc/README.md (bootstrap work package).
#pragma once

#include <string>

#include "transport/channel.h"  // Deadline

namespace appliance {

struct Listener {
  int fd = -1;
  int port = 0;
  Listener() = default;
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  Listener(Listener&& o) noexcept;
  Listener& operator=(Listener&& o) noexcept;
  ~Listener();
};

// Bind `host` (an address or name; "" or "0.0.0.0" = all) on `port` (0 = ephemeral).
Listener listen_tcp(const std::string& host, int port, int backlog = 128);

// Accept one connection; -1 on deadline. Applies the standard options.
int accept_tcp(const Listener& l, Deadline deadline, std::string* peer_addr = nullptr);

// Connect, retrying refused/unreachable until the deadline (the listener may not be up
// yet). Throws Error(kTimeout) whose text says what was tried and the last errno.
int connect_tcp(const std::string& host, int port, Deadline deadline, const std::string& what);

// Set TCP_NODELAY, keepalive and user timeout on a connected socket.
void tune_socket(int fd, int peer_timeout_ms);

// Blocking helpers with deadline for handshakes on a raw fd.
void write_all(int fd, const void* p, size_t n, Deadline d, const std::string& what);
void read_all(int fd, void* p, size_t n, Deadline d, const std::string& what);

}  // namespace appliance
