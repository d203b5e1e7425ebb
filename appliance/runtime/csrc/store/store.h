// Store: the tiny key-value service ranks bootstrap through. Rank 0 hosts a TcpStoreServer
// (a thread) at the address the launcher hands out; every rank, rank 0 included, talks to
// it with a TcpStoreClient. Values are opaque bytes. Every connection is authenticated
// (transport/auth.h). Waits are bounded; a timeout names the keys that never appeared.
// Wire protocol: store/store_protocol.h. A TcpStoreClient may be shared by several threads
// (calls run concurrently over its one connection; a parked GET does not delay a SET), but
// must outlive them. release() closes the connection while nothing is in flight (a rank holds
// no socket to the store once it has joined); the next call connects again. Strangers at the
// server are logged to stderr (rate-limited) and dropped.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "transport/auth.h"

namespace appliance {

// A wait that timed out, with the keys that never appeared.
class StoreTimeout : public Error {
 public:
  StoreTimeout(const Status& s, std::vector<std::string> missing) : Error(s), missing(std::move(missing)) {}
  std::vector<std::string> missing;
};

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Wait until `key` exists (up to timeout_ms) and return its value; Error(kTimeout) otherwise.
  virtual std::vector<uint8_t> get(const std::string& key, int64_t timeout_ms) = 0;
  // Wait until all keys exist; Error(kTimeout) listing the missing ones otherwise.
  virtual void wait(const std::vector<std::string>& keys, int64_t timeout_ms) = 0;
  // Atomically add delta to the integer at key (missing = 0) and return the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Waits until all keys exist and returns their values in key order, in one request;
  // StoreTimeout (kTimeout, with the keys that never appeared) otherwise.
  virtual std::vector<std::vector<uint8_t>> get_many(const std::vector<std::string>& keys, int64_t timeout_ms) = 0;
};

class TcpStoreServer {
 public:
  // Listens on bind_host:port (port 0 = ephemeral) and serves until destroyed.
  TcpStoreServer(const std::string& bind_host, int port, AuthParams auth);
  ~TcpStoreServer();
  int port() const;
  uint64_t served() const;  // requests answered or parked so far (diagnostics)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class TcpStoreClient final : public Store {
 public:
  // Connects (retrying until connect_timeout_ms: rank 0 may start later than us).
  TcpStoreClient(const std::string& host, int port, AuthParams auth, int64_t connect_timeout_ms);
  ~TcpStoreClient() override;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, int64_t timeout_ms) override;
  void wait(const std::vector<std::string>& keys, int64_t timeout_ms) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::vector<std::vector<uint8_t>> get_many(const std::vector<std::string>& keys, int64_t timeout_ms) override;
  // Closes the connection now if no call is in flight; a later call connects again.
  void release();
  uint64_t requests() const;  // requests this client sent so far (diagnostics)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace appliance
