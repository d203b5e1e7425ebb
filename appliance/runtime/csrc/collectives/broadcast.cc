// Broadcast: binomial tree for small buffers, pipelined chain for large ones.
//
// Cost model, P ranks, N bytes, C = chunk_bytes (capped at N), alpha = per-step latency:
//   tree:  ceil(log2 P) steps, each moving the whole N; the root sends N * ceil(log2 P),
//          inner ranks fewer; time ~ ceil(log2 P) * (alpha + N/beta).
//   chain: ranks in order root, root+1, ...; ceil(N/C) + P - 2 steps, each moving one
//          chunk per link; every rank but the last sends N once; time ~
//          (ceil(N/C) + P - 2) * (alpha + C/beta), i.e. ~N/beta for N >> P*C whatever P.
// Choice (kAuto): P == 2 is a single hop (tree = one message); otherwise the cheaper of the
// two formulas with alpha expressed as kAlphaBytes of transfer (~20 us at a few GB/s). With
// the default 1 MiB chunks that means tree up to about a chunk (and more for larger P),
// chain above. Memory: none; data moves straight between the links and `buf`.
#include <algorithm>

#include "collectives/ring.h"

namespace appliance {

namespace {

constexpr double kAlphaBytes = 64 * 1024;

int ceil_log2(int p) {
  int l = 0;
  while ((1 << l) < p) ++l;
  return l;
}

void tree(Comm& c, uint8_t* buf, size_t n, int root) {
  const int P = c.size();
  const int v = ring::mod(c.rank() - root, P);  // rank relative to the root
  int span;                                     // children are v + m for m < span
  if (v == 0) {
    span = 1 << ceil_log2(P);
  } else {
    span = v & -v;
    c.recv(ring::mod(v - span + root, P), buf, n);
  }
  std::vector<SendOp> sends;
  for (int m = span / 2; m >= 1; m /= 2)
    if (v + m < P) sends.push_back(SendOp{ring::mod(v + m + root, P), buf, n});
  std::vector<RecvOp> none;
  if (!sends.empty()) c.exchange(sends, none);
}

void chain(Comm& c, uint8_t* buf, size_t n, int root, size_t chunk) {
  const int P = c.size();
  const int v = ring::mod(c.rank() - root, P);
  const int prev = ring::mod(c.rank() - 1, P), next = ring::mod(c.rank() + 1, P);
  const bool has_next = v < P - 1;
  const size_t nchunks = (n + chunk - 1) / chunk;
  auto piece = [&](size_t t) { return std::min(chunk, n - t * chunk); };
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  // step t: receive chunk t from prev, forward chunk t-1 to next
  for (size_t t = 0; t <= nchunks; ++t) {
    sends.clear();
    recvs.clear();
    if (v == 0) {
      if (t == nchunks) break;
      sends.push_back(SendOp{next, buf + t * chunk, piece(t)});
    } else {
      if (t >= 1 && has_next) sends.push_back(SendOp{next, buf + (t - 1) * chunk, piece(t - 1)});
      if (t < nchunks) {
        recvs.emplace_back();
        recvs.back().peer = prev;
        recvs.back().data = buf + t * chunk;
        recvs.back().len = piece(t);
      }
    }
    if (!sends.empty() || !recvs.empty()) c.exchange(sends, recvs);
  }
}

}  // namespace

void broadcast(Comm& c, void* buf, size_t bytes, int root, const CollectiveOptions& o) {
  const int P = c.size();
  if (root < 0 || root >= P)
    throw Error(Code::kInvalid, "broadcast: root " + std::to_string(root) + " outside 0.." + std::to_string(P - 1));
  if (P == 1 || bytes == 0) return;
  uint8_t* b = static_cast<uint8_t*>(buf);
  const size_t chunk = std::max<size_t>(1, std::min(o.chunk_bytes, bytes));
  BroadcastAlgo algo = o.broadcast_algo;
  if (algo == BroadcastAlgo::kAuto) {
    if (P == 2) {
      algo = BroadcastAlgo::kTree;
    } else {
      const double nchunks = static_cast<double>((bytes + chunk - 1) / chunk);
      const double t_chain = (nchunks + P - 2) * (kAlphaBytes + static_cast<double>(chunk));
      const double t_tree = ceil_log2(P) * (kAlphaBytes + static_cast<double>(bytes));
      algo = t_chain < t_tree ? BroadcastAlgo::kChain : BroadcastAlgo::kTree;
    }
  }
  if (algo == BroadcastAlgo::kChain) {
    chain(c, b, bytes, root, chunk);
  } else {
    tree(c, b, bytes, root);
  }
}

}  // namespace appliance
