// N ranks as N threads over socketpairs, with an abort board and fault injection. See the
// header for what it stands in for.
#include "hooks/dataplane_harness.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>

#include "transport/channel.h"
#include "transport/shm/shm_link.h"
#include "transport/tcp/tcp_link.h"

namespace appliance {
namespace testing {

namespace {

// A link that crashes its rank after some bytes, or corrupts one byte of the stream.
class FaultLink final : public Link {
 public:
  FaultLink(LinkPtr inner, int64_t close_after, int64_t corrupt_at)
      : Link(inner->peer(), inner->peer_host()), inner_(std::move(inner)), close_after_(close_after),
        corrupt_at_(corrupt_at) {}
  const char* kind() const override { return inner_->kind(); }
  int wait_handle() const override { return inner_->wait_handle(); }
  short arm_wait(bool rd, bool wr) override { return inner_->arm_wait(rd, wr); }
  bool spins() const override { return inner_->spins(); }
  void close() override { inner_->close(); }
  size_t recv_some(void* data, size_t len) override { return inner_->recv_some(data, len); }

  size_t send_some(const void* data, size_t len) override {
    if (close_after_ >= 0) {
      if (sent_ >= close_after_) {
        inner_->close();
        throw Error(Code::kInternal, "injected crash after " + std::to_string(sent_) + " bytes sent to rank " +
                                         std::to_string(peer()));
      }
      len = std::min<size_t>(len, static_cast<size_t>(close_after_ - sent_));
    }
    if (len && corrupt_at_ >= sent_ && corrupt_at_ < sent_ + static_cast<int64_t>(len)) {
      if (corrupt_at_ > sent_) {
        len = static_cast<size_t>(corrupt_at_ - sent_);  // up to the victim byte
      } else {
        uint8_t b = static_cast<const uint8_t*>(data)[0] ^ 0xFF;
        size_t n = inner_->send_some(&b, 1);
        sent_ += static_cast<int64_t>(n);
        return n;
      }
    }
    size_t n = inner_->send_some(data, len);
    sent_ += static_cast<int64_t>(n);
    return n;
  }

 private:
  LinkPtr inner_;
  int64_t close_after_, corrupt_at_;
  int64_t sent_ = 0;
};

// First failure wins; every rank's Watch pipe is poked so it notices at once.
class AbortBoard {
 public:
  explicit AbortBoard(std::vector<int> wfds) : wfds_(std::move(wfds)) {}
  void post(const Status& s) {
    std::lock_guard<std::mutex> g(mu_);
    if (!first_) first_ = s;
    for (int fd : wfds_) {
      ssize_t rc = ::write(fd, "!", 1);
      (void)rc;
    }
  }
  std::optional<Status> first() {
    std::lock_guard<std::mutex> g(mu_);
    return first_;
  }

 private:
  std::mutex mu_;
  std::optional<Status> first_;
  std::vector<int> wfds_;
};

struct Pipe {
  int rd = -1, wr = -1;
  Pipe() {
    int fds[2];
    if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) throw Error(Code::kInternal, "pipe2 failed");
    rd = fds[0];
    wr = fds[1];
  }
  ~Pipe() {
    ::close(rd);
    ::close(wr);
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
};

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<size_t> prefix(const std::vector<size_t>& v) {
  std::vector<size_t> off(v.size());
  size_t at = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    off[i] = at;
    at += v[i];
  }
  return off;
}

// One rank's part: set up buffers, run the collective `iterations` times, keep the output.
void run_rank(const CollectiveSpec& spec, int r, Comm& comm, const std::vector<std::vector<uint8_t>>& inputs,
              RankResult& res, Clock::time_point t0) {
  const int P = spec.nranks;
  const std::vector<uint8_t>& in = inputs[r];
  const size_t esz = dtype_size(spec.dtype);
  std::vector<uint8_t> buf, out;
  std::vector<size_t> sizes;
  if (spec.kind == "allgatherv") {
    for (int p = 0; p < P; ++p) sizes.push_back(inputs[p].size());
    out.resize(std::accumulate(sizes.begin(), sizes.end(), size_t{0}));
  } else if (spec.kind == "alltoallv") {
    for (int p = 0; p < P; ++p) sizes.push_back(spec.send_bytes[p][r]);
    out.resize(std::accumulate(sizes.begin(), sizes.end(), size_t{0}));
  } else if (spec.kind == "reducescatter") {
    out.resize(spec.counts[r] * esz);
  }
  // Hierarchical: this rank's host view and its cross view (one rank per host), as the CPU
  // backend builds them (made here, after the Watch is set: views copy it).
  std::unique_ptr<Comm> local, cross;
  const int L = spec.local_size;
  if (L > 0) {
    std::vector<int> lm, cm;
    for (int i = 0; i < L; ++i) lm.push_back((r / L) * L + i);
    for (int h = 0; h < P / L; ++h) cm.push_back(h * L + r % L);
    local = std::make_unique<Comm>(comm, lm);
    cross = std::make_unique<Comm>(comm, cm);
  }
  for (int it = 0; it < spec.iterations; ++it) {
    buf = in;
    if (spec.sync) barrier(comm);
    if (r == spec.delay_rank) std::this_thread::sleep_for(std::chrono::milliseconds(spec.delay_ms));
    res.enter_s = since(t0);
    auto start = Clock::now();
    if (spec.kind == "allreduce") {
      // alias: in place; otherwise from buf into out, and buf must come back untouched.
      if (!spec.alias) out.assign(buf.size(), 0xA5);
      if (L > 0)
        allreduce_hierarchical(*local, *cross, buf.data(), spec.alias ? buf.data() : out.data(), buf.size() / esz,
                               spec.dtype, spec.op, spec.opts);
      else
        allreduce(comm, buf.data(), spec.alias ? buf.data() : out.data(), buf.size() / esz, spec.dtype, spec.op,
                  spec.opts);
      if (!spec.alias && buf != in) throw Error(Code::kInternal, "allreduce wrote to its input");
    } else if (spec.kind == "adasum") {
      std::vector<size_t> counts = spec.counts.empty() ? std::vector<size_t>{buf.size() / esz} : spec.counts;
      adasum_allreduce(comm, buf.data(), counts, spec.dtype, spec.opts);
    } else if (spec.kind == "broadcast") {
      broadcast(comm, buf.data(), buf.size(), spec.root, spec.opts);
    } else if (spec.kind == "allgatherv") {
      const void* src = buf.data();
      if (spec.alias) {
        uint8_t* mine = out.data() + prefix(sizes)[r];
        if (!buf.empty()) std::memcpy(mine, buf.data(), buf.size());
        src = mine;
      }
      if (L > 0)
        allgatherv_hierarchical(*local, r % L == 0 ? cross.get() : nullptr, r / L, src, out.data(), sizes, spec.opts);
      else
        allgatherv(comm, src, out.data(), sizes, spec.opts);
    } else if (spec.kind == "alltoallv") {
      alltoallv(comm, buf.data(), spec.send_bytes[r], out.data(), sizes, spec.opts);
    } else if (spec.kind == "reducescatter") {
      uint8_t* dst = spec.alias ? buf.data() + prefix(spec.counts)[r] * esz : out.data();
      reducescatter(comm, buf.data(), dst, spec.counts, spec.dtype, spec.op, spec.opts);
      if (spec.alias && !out.empty()) std::memcpy(out.data(), dst, out.size());
    } else if (spec.kind == "barrier") {
      barrier(comm);
    } else {
      throw Error(Code::kInvalid, "unknown collective kind '" + spec.kind + "'");
    }
    res.seconds += std::chrono::duration<double>(Clock::now() - start).count();
    res.exit_s = since(t0);
  }
  if ((spec.kind == "allreduce" && spec.alias) || spec.kind == "adasum" || spec.kind == "broadcast") {
    res.output = std::move(buf);
  } else {
    res.output = std::move(out);
  }
}

void validate(const CollectiveSpec& spec, const std::vector<std::vector<uint8_t>>& inputs) {
  const int P = spec.nranks;
  if (P < 1 || P > 64) throw Error(Code::kInvalid, "nranks must be 1..64");
  if (static_cast<int>(inputs.size()) != P) throw Error(Code::kInvalid, "one input per rank");
  if (spec.kind == "alltoallv") {
    if (static_cast<int>(spec.send_bytes.size()) != P) throw Error(Code::kInvalid, "send_bytes needs P rows");
    for (int r = 0; r < P; ++r) {
      if (static_cast<int>(spec.send_bytes[r].size()) != P) throw Error(Code::kInvalid, "send_bytes rows need P");
      size_t tot = std::accumulate(spec.send_bytes[r].begin(), spec.send_bytes[r].end(), size_t{0});
      if (tot != inputs[r].size()) throw Error(Code::kInvalid, "input size != sum(send_bytes[rank])");
    }
  }
  if (spec.kind == "adasum" && !spec.counts.empty()) {
    size_t tot = std::accumulate(spec.counts.begin(), spec.counts.end(), size_t{0}) * dtype_size(spec.dtype);
    for (auto& in : inputs)
      if (in.size() != tot) throw Error(Code::kInvalid, "adasum: input size != sum(counts) elements");
  }
  if (spec.kind == "reducescatter") {
    if (static_cast<int>(spec.counts.size()) != P) throw Error(Code::kInvalid, "counts needs P entries");
    size_t tot = std::accumulate(spec.counts.begin(), spec.counts.end(), size_t{0}) * dtype_size(spec.dtype);
    for (auto& in : inputs)
      if (in.size() != tot) throw Error(Code::kInvalid, "input size != sum(counts) elements");
  }
}

}  // namespace

HarnessResult run_collective(const CollectiveSpec& spec, const std::vector<std::vector<uint8_t>>& inputs) {
  validate(spec, inputs);
  if (spec.transport != "tcp" && spec.transport != "shm")
    throw Error(Code::kInvalid, "transport must be tcp or shm, not " + spec.transport);
  const int P = spec.nranks;
  // links: one socketpair per pair of ranks
  std::vector<std::vector<std::unique_ptr<Channel>>> chans(P);
  for (auto& v : chans) v.resize(P);
  auto wrap = [&](LinkPtr l, int owner) -> LinkPtr {
    if (spec.sockbuf > 0 && spec.transport == "tcp") {
      int fd = l->wait_handle();
      ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &spec.sockbuf, sizeof(spec.sockbuf));
      ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &spec.sockbuf, sizeof(spec.sockbuf));
    }
    if (owner == spec.fault.rank && l->peer() == spec.fault.peer)
      return std::make_unique<FaultLink>(std::move(l), spec.fault.close_after, spec.fault.corrupt_at);
    return l;
  };
  const uint32_t max_payload = static_cast<uint32_t>(std::max<size_t>(spec.max_frame, 1));
  for (int i = 0; i < P; ++i)
    for (int j = i + 1; j < P; ++j) {
      auto pr = spec.transport == "shm" ? make_shm_link_pair(i, j, spec.shm_ring_bytes) : make_socketpair_links(i, j);
      chans[i][j] = std::make_unique<Channel>(wrap(std::move(pr.first), i), max_payload);
      chans[j][i] = std::make_unique<Channel>(wrap(std::move(pr.second), j), max_payload);
    }
  std::vector<std::unique_ptr<Pipe>> pipes;
  std::vector<int> wfds;
  for (int r = 0; r < P; ++r) {
    pipes.push_back(std::make_unique<Pipe>());
    wfds.push_back(pipes.back()->wr);
  }
  AbortBoard board(wfds);
  std::vector<std::unique_ptr<Comm>> comms;
  for (int r = 0; r < P; ++r) {
    comms.push_back(std::make_unique<Comm>(r, P, std::move(chans[r]), spec.max_frame));
    int rd = pipes[r]->rd;
    comms.back()->set_watch(Watch{spec.watch_fd ? rd : -1, [rd, &board]() {
                                    char sink[64];
                                    while (::read(rd, sink, sizeof(sink)) > 0) {
                                    }
                                    if (auto s = board.first()) throw Error(*s);
                                  }});
  }

  HarnessResult result;
  result.ranks.resize(P);
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r) {
    threads.emplace_back([&, r]() {
      RankResult& res = result.ranks[r];
      const bool victim = r == spec.fault.rank && spec.fault.close_after >= 0;
      try {
        run_rank(spec, r, *comms[r], inputs, res, t0);
      } catch (const Error& e) {
        res.error = e.status();
        res.exit_s = since(t0);
        if (!victim) board.post(e.status());  // a crashed rank reports nothing
      } catch (const std::exception& e) {
        res.error = Status{Code::kInternal, r, "", e.what()};
        res.exit_s = since(t0);
        board.post(*res.error);
      }
      comms[r].reset();  // close this rank's links, as a process exit would
      std::lock_guard<std::mutex> g(mu);
      ++finished;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lk(mu);
    if (!cv.wait_for(lk, std::chrono::milliseconds(spec.timeout_ms), [&] { return finished == P; })) {
      lk.unlock();
      board.post(Status{Code::kTimeout, -1, "", "harness: the collective did not finish within " +
                                                    std::to_string(spec.timeout_ms) + " ms"});
    }
  }
  for (auto& t : threads) t.join();
  result.job_error = board.first();
  result.wall_s = since(t0);
  return result;
}

}  // namespace testing
}  // namespace appliance
