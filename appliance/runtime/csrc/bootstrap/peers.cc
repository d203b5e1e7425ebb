// PeerInfo's bytes, topology and host keys (see peers.h).
#include "bootstrap/peers.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>

#include "common/status.h"
#include "wire/codec.h"

namespace appliance {

namespace {

std::string read_first_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

// Fields of a host key after the host name: "<boot id>/ipc:<ns>/shm:<dev>" (local_host_key()).
std::string machine_part(const std::string& key) {
  size_t i = key.find('/');
  return i == std::string::npos ? std::string() : key.substr(i + 1);
}

}  // namespace

Topology compute_topology(const std::vector<std::string>& hosts, int rank) {
  APPLIANCE_ASSERT(rank >= 0 && rank < static_cast<int>(hosts.size()), "rank outside the host list");
  const int n = static_cast<int>(hosts.size());
  std::vector<int> local(n, 0);
  std::map<std::string, int> per_host;
  for (int r = 0; r < n; ++r) local[r] = per_host[hosts[r]]++;
  Topology t;
  t.local_rank = local[rank];
  t.local_size = per_host[hosts[rank]];
  // Cross group: ranks with my local_rank, in rank order (= hosts in order of appearance).
  t.cross_rank = 0;
  t.cross_size = 0;
  for (int r = 0; r < n; ++r) {
    if (local[r] != t.local_rank) continue;
    if (r < rank) ++t.cross_rank;
    ++t.cross_size;
  }
  return t;
}

std::vector<uint8_t> encode_peer(const PeerInfo& p, int size) {
  Writer w;
  w.i32(p.rank);
  w.i32(size);
  w.str(p.host);
  w.str(p.host_key);
  w.str(p.addr);
  w.i32(p.port);
  return w.take();
}

PeerInfo decode_peer(const std::vector<uint8_t>& b, int expect_rank, int my_size) {
  Reader r(b.data(), b.size(), "peer info of rank " + std::to_string(expect_rank));
  PeerInfo p;
  p.rank = r.i32();
  int size = r.i32();
  p.host = r.str(1024);
  p.host_key = r.str(4096);
  p.addr = r.str(1024);
  p.port = r.i32();
  r.expect_done();
  if (p.rank != expect_rank) r.fail("it claims rank " + std::to_string(p.rank));
  if (size != my_size)
    throw Error(Code::kMismatch,
                "rank " + std::to_string(p.rank) + " was started with size " + std::to_string(size) + ", this rank with " +
                    std::to_string(my_size),
                p.rank, p.host);
  if (p.port <= 0 || p.port > 65535) r.fail("port " + std::to_string(p.port));
  return p;
}

std::string local_hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

std::string local_host_key() {
  std::string key = local_hostname();
  key += "/" + read_first_line("/proc/sys/kernel/random/boot_id");
  struct stat st;
  key += "/ipc:" + (stat("/proc/self/ns/ipc", &st) == 0 ? std::to_string(st.st_ino) : std::string("?"));
  key += "/shm:" + (stat("/dev/shm", &st) == 0 ? std::to_string(st.st_dev) : std::string("?"));
  return key;
}

bool shm_possible(const PeerInfo& a, const PeerInfo& b) {
  std::string x = machine_part(a.host_key);
  return !x.empty() && x == machine_part(b.host_key);
}

bool same_kernel(const PeerInfo& a, const PeerInfo& b) {
  std::string x = machine_part(a.host_key), y = machine_part(b.host_key);
  x = x.substr(0, x.find('/'));
  return !x.empty() && x == y.substr(0, y.find('/'));
}

}  // namespace appliance
