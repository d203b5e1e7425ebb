// Plain TCP plumbing: listening, connecting with retry until a deadline, socket options.
// Every socket the core opens gets TCP_NODELAY, SO_KEEPALIVE with short probes and
// TCP_USER_TIMEOUT, so a peer whose host vanishes is noticed in seconds even mid-transfer.
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

// Budget for noticing a silent peer when the caller does not say (MeshOptions has its own).
constexpr int kDefaultPeerTimeoutMs = 10000;

// Accept one connection; -1 on deadline. Applies the standard options. The fd is
// blocking and close-on-exec; `peer_addr` receives "a.b.c.d:port".
int accept_tcp(const Listener& l, Deadline deadline, std::string* peer_addr = nullptr,
               int peer_timeout_ms = kDefaultPeerTimeoutMs);

// Connect, retrying refused/unreachable until the deadline (the listener may not be up
// yet). Throws Error(kTimeout) whose text says what was tried and the last errno. `what`
// names the other end ("rank 3 (hostB)", "the store"). The fd is blocking, close-on-exec,
// tuned with tune_socket().
int connect_tcp(const std::string& host, int port, Deadline deadline, const std::string& what,
                int peer_timeout_ms = kDefaultPeerTimeoutMs);

// Set TCP_NODELAY, keepalive and user timeout on a connected socket. Keepalive starts
// probing after half the budget and gives up within it; TCP_USER_TIMEOUT = the budget.
void tune_socket(int fd, int peer_timeout_ms);

// Blocking helpers with deadline for handshakes on a raw fd (blocking or not). Timeout ->
// Error(kTimeout); EOF/reset -> Error(kPeerLost); `what` says what was being moved.
void write_all(int fd, const void* p, size_t n, Deadline d, const std::string& what);
void read_all(int fd, void* p, size_t n, Deadline d, const std::string& what);

// poll() one fd for `events` until the deadline; true when ready (or in error/hang-up).
bool wait_fd(int fd, short events, Deadline d);

// Milliseconds from now to the deadline for poll(): 0 when past, -1 for no_deadline().
int poll_timeout_ms(Deadline d);

// "a.b.c.d:port" of the remote end of a connected socket ("?" when unknown).
std::string peer_address(int fd);

// The address a server should bind when clients were told to reach it at `host` (the
// job's chosen address, e.g. APPLIANCE_STORE_ADDR's host part): `host` itself when it is an
// IPv4 literal, its address when it is a name (localhost -> 127.0.0.1); "" (all addresses)
// for "", "0.0.0.0", a name that does not resolve, or a name other than localhost that
// resolves to loopback here (it may be routable from other hosts).
std::string server_bind_address(const std::string& host);

// The local IPv4 address the kernel would use to reach `host` (no packet is sent); ""
// when `host` does not resolve or has no route.
std::string route_address(const std::string& host);

}  // namespace appliance
