// Adasum allreduce (Maleki et al., "Scaling Distributed Training with Adaptive Summation",
// arXiv 2006.02924): vector-halving, distance-doubling (VHDD), in place.
//
//   Adasum(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b
// (a coefficient is 1 when its vector has norm 0), applied pairwise up a binary tree of the
// ranks: level l combines the results of two neighbouring subtrees of 2^l ranks each. So
// orthogonal gradients add up, and equal gradients give that gradient once.
//
// Cost model, P = 2^L ranks, N bytes, T tensors in the buffer:
//   reduce half: L steps; at level l (distance d = 2^l) each rank swaps half of the segment it
//     holds with rank^d (N/2^(l+1) bytes each way), combines its half, and then sums the
//     level's 3T partial dot products/norms (doubles) over the 2^(l+1) ranks that share the
//     level: l+1 recursive-doubling steps of 24T bytes.
//   gather half: L steps, the segments travel back (distance halving): a ring-free allgather.
//   bytes on the wire per rank: 2N(P-1)/P (as the ring); messages: 2L + L(L+1)/2, against the
//   ring's 2(P-1): fewer for P >= 8 and latency-bound sizes. Compute: 2 passes over N(P-1)/P:
//   the dots, taken on each received piece (chunk_bytes) as it arrives, overlapping the
//   transfer, then the combination, which needs the level's completed sums; dots in double,
//   combination in float (float16/bfloat16 widened).
// Non-power-of-2 P: the Q = 2^floor(log2 P) lowest ranks run VHDD. Before it, each extra rank
//   Q+i sends its whole buffer to rank i, which folds it in locally (rank i's input becomes
//   Adasum(g_i, g_{Q+i}), with whole-vector dot products, no communication); after it, rank i
//   sends the result back. Cost: 2 more steps of N bytes on those pairs. Horovod refuses CPU
//   Adasum at non-power-of-2 sizes; here the tree is lopsided instead (P=3: Adasum(Adasum(g0,
//   g2), g1); P=5: Adasum(Adasum(Adasum(g0,g4), g1), Adasum(g2,g3))), and keeps Adasum's
//   properties: orthogonal inputs add up, equal inputs give the input.
// Several tensors in one buffer (a fused entry): every tensor gets its own dot products and
//   coefficients; a rank's segment may cut across tensors, each cut part contributes to its
//   own tensor's sums.
// Memory: Comm workspace of N/2 bytes (N on folding ranks) for the received half.
// Determinism: the per-level sums are reduced with XOR partners, and a+b == b+a in IEEE, so
//   every rank of a level computes bit-identical coefficients.
// Failure modes: Error(kInvalid) for a dtype that is not floating point; Comm errors
//   propagate unchanged (peer lost, protocol, watch).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "collectives/collectives.h"
#include "collectives/reduce.h"
#include "common/status.h"

namespace appliance {

namespace {

// Loading and storing elements as their computation type.
template <typename T>
struct Plain {
  using Store = T;
  using Calc = T;
  static Calc load(Store x) { return x; }
  static Store store(Calc x) { return x; }
};
struct Half {
  using Store = uint16_t;
  using Calc = float;
  static Calc load(Store x) { return half_to_float(x); }
  static Store store(Calc x) { return float_to_half(x); }
};
struct BHalf {
  using Store = uint16_t;
  using Calc = float;
  static Calc load(Store x) { return bfloat16_to_float(x); }
  static Store store(Calc x) { return float_to_bfloat16(x); }
};

// out += (a.b, a.a, b.b) over n elements, in double with kLanes independent accumulators
// (independent chains of adds, which the CPU overlaps).
constexpr int kLanes = 8;
template <typename E>
void partials(const void* av, const void* bv, size_t n, double* out) {
  const auto* a = static_cast<const typename E::Store*>(av);
  const auto* b = static_cast<const typename E::Store*>(bv);
  double ab[kLanes] = {}, aa[kLanes] = {}, bb[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const double x = static_cast<double>(E::load(a[i + j])), y = static_cast<double>(E::load(b[i + j]));
      ab[j] += x * y;
      aa[j] += x * x;
      bb[j] += y * y;
    }
  for (; i < n; ++i) {
    const double x = static_cast<double>(E::load(a[i])), y = static_cast<double>(E::load(b[i]));
    ab[0] += x * y;
    aa[0] += x * x;
    bb[0] += y * y;
  }
  for (int j = 0; j < kLanes; ++j) {
    out[0] += ab[j];
    out[1] += aa[j];
    out[2] += bb[j];
  }
}

// dst[i] = ca a[i] + cb b[i]; dst may be a or b.
template <typename E>
void combine(void* dstv, const void* av, const void* bv, size_t n, double ca, double cb) {
  auto* dst = static_cast<typename E::Store*>(dstv);
  const auto* a = static_cast<const typename E::Store*>(av);
  const auto* b = static_cast<const typename E::Store*>(bv);
  using C = typename E::Calc;
  const C fa = static_cast<C>(ca), fb = static_cast<C>(cb);
  for (size_t i = 0; i < n; ++i) dst[i] = E::store(fa * E::load(a[i]) + fb * E::load(b[i]));
}

double coefficient(double dot, double own_normsq) { return own_normsq > 0 ? 1.0 - dot / (2.0 * own_normsq) : 1.0; }

// Everything one call needs: the element kind, the tensor boundaries, the buffer.
template <typename E>
class Adasum {
 public:
  Adasum(Comm& c, uint8_t* buf, const std::vector<size_t>& counts, size_t chunk_bytes)
      : c_(c),
        buf_(buf),
        esz_(sizeof(typename E::Store)),
        grain_(std::max(esz_, chunk_bytes - chunk_bytes % esz_)),
        bounds_(counts.size() + 1, 0),
        sums_(3 * counts.size()) {
    std::partial_sum(counts.begin(), counts.end(), bounds_.begin() + 1);
  }

  void run() {
    const int P = c_.size(), r = c_.rank();
    const size_t total = bounds_.back();
    if (P == 1 || total == 0) return;
    int Q = 1;
    while (Q * 2 <= P) Q *= 2;
    const size_t bytes = total * esz_;
    if (r >= Q) {  // folded into rank r - Q: hand over the input, get the result back
      c_.send(r - Q, buf_, bytes);
      c_.recv(r - Q, buf_, bytes);
      return;
    }
    const bool folds = r + Q < P;
    uint8_t* ws = static_cast<uint8_t*>(c_.workspace(folds ? bytes : (total - total / 2) * esz_));
    if (folds) {  // whole vectors on one rank: the sums need no communication
      std::fill(sums_.begin(), sums_.end(), 0.0);
      receive_accumulating(r + Q, ws, 0, total, buf_, ws);
      combine_range(0, total, buf_, ws, buf_);
    }
    vhdd(Q, ws);
    if (folds) c_.send(r + Q, buf_, bytes);
  }

 private:
  struct Seg {
    size_t begin, len;
  };

  // Add the per-tensor partial sums of a and b over the elements [begin, begin+len) (the
  // pointers are at element `begin`) to sums_.
  void accumulate(size_t begin, size_t len, const uint8_t* a, const uint8_t* b) {
    for_tensors(begin, len, [&](size_t k, size_t at, size_t n) {
      partials<E>(a + at * esz_, b + at * esz_, n, &sums_[3 * k]);
    });
  }

  // Receive len elements from `peer` into `into` (while sending `send`, if any), adding the
  // partial sums of a and b (at element `begin`; one of them is `into`) to sums_ piece by
  // piece as they arrive, so the dot products overlap the transfer and read cache-hot data.
  void receive_accumulating(int peer, uint8_t* into, size_t begin, size_t len, const uint8_t* a, const uint8_t* b,
                            SendOp send = SendOp{-1, nullptr, 0}) {
    std::vector<SendOp> sends;
    if (send.peer >= 0) sends.push_back(send);
    std::vector<RecvOp> recvs(1);
    recvs[0].peer = peer;
    recvs[0].data = into;
    recvs[0].len = len * esz_;
    recvs[0].grain = grain_;
    recvs[0].on_piece = [&](size_t off, size_t n) { accumulate(begin + off / esz_, n / esz_, a + off, b + off); };
    c_.exchange(sends, recvs);
  }

  // With sums_ complete: dst = Adasum(a, b) per tensor over [begin, begin+len).
  void combine_range(size_t begin, size_t len, const uint8_t* a, const uint8_t* b, uint8_t* dst) {
    for_tensors(begin, len, [&](size_t k, size_t at, size_t n) {
      const double dot = sums_[3 * k], aa = sums_[3 * k + 1], bb = sums_[3 * k + 2];
      combine<E>(dst + at * esz_, a + at * esz_, b + at * esz_, n, coefficient(dot, aa), coefficient(dot, bb));
    });
  }

  // f(tensor index, offset relative to begin, element count) for each tensor part in range.
  template <typename F>
  void for_tensors(size_t begin, size_t len, F&& f) const {
    const size_t end = begin + len;
    size_t k = static_cast<size_t>(std::upper_bound(bounds_.begin(), bounds_.end(), begin) - bounds_.begin()) - 1;
    for (; k + 1 < bounds_.size() && bounds_[k] < end; ++k) {
      const size_t lo = std::max(begin, bounds_[k]), hi = std::min(end, bounds_[k + 1]);
      if (hi > lo) f(k, lo - begin, hi - lo);
    }
  }

  void vhdd(int Q, uint8_t* ws) {
    const int r = c_.rank();
    std::vector<Seg> held;  // the segment held before each level, for the way back
    Seg s{0, bounds_.back()};
    std::vector<double> peer_sums(sums_.size());
    for (int d = 1; d < Q; d <<= 1) {
      const int peer = r ^ d;
      const bool left = (r & d) == 0;  // left subtree: my data is `a`
      const size_t h = s.len / 2;
      const Seg keep = left ? Seg{s.begin, h} : Seg{s.begin + h, s.len - h};
      const Seg give = left ? Seg{s.begin + h, s.len - h} : Seg{s.begin, h};
      uint8_t* mine = buf_ + keep.begin * esz_;
      const uint8_t* a = left ? mine : ws;
      const uint8_t* b = left ? ws : mine;
      std::fill(sums_.begin(), sums_.end(), 0.0);
      receive_accumulating(peer, ws, keep.begin, keep.len, a, b,
                           SendOp{peer, buf_ + give.begin * esz_, give.len * esz_});
      // Complete the sums over the 2d ranks of this level (recursive doubling, XOR partners).
      const size_t nb = sums_.size() * sizeof(double);
      for (int e = 1; e <= d; e <<= 1) {
        c_.sendrecv(r ^ e, sums_.data(), nb, r ^ e, peer_sums.data(), nb);
        for (size_t i = 0; i < sums_.size(); ++i) sums_[i] += peer_sums[i];
      }
      combine_range(keep.begin, keep.len, a, b, mine);
      held.push_back(s);
      s = keep;
    }
    for (int d = Q / 2; d >= 1; d >>= 1) {
      const Seg parent = held.back();
      held.pop_back();
      const bool left = (r & d) == 0;
      const size_t h = parent.len / 2;
      const Seg theirs = left ? Seg{parent.begin + h, parent.len - h} : Seg{parent.begin, h};
      c_.sendrecv(r ^ d, buf_ + s.begin * esz_, s.len * esz_, r ^ d, buf_ + theirs.begin * esz_, theirs.len * esz_);
      s = parent;
    }
  }

  Comm& c_;
  uint8_t* buf_;
  size_t esz_;
  size_t grain_;                // whole elements of at most chunk_bytes: partial sums per piece
  std::vector<size_t> bounds_;  // tensor k is elements [bounds_[k], bounds_[k+1])
  std::vector<double> sums_;    // per tensor: a.b, |a|^2, |b|^2
};

}  // namespace

void adasum_allreduce(Comm& c, void* buf, const std::vector<size_t>& counts, DataType dt, const CollectiveOptions& o) {
  auto* b = static_cast<uint8_t*>(buf);
  const size_t chunk = o.chunk_bytes;
  switch (dt) {
    case DataType::kFloat32: return Adasum<Plain<float>>(c, b, counts, chunk).run();
    case DataType::kFloat64: return Adasum<Plain<double>>(c, b, counts, chunk).run();
    case DataType::kFloat16: return Adasum<Half>(c, b, counts, chunk).run();
    case DataType::kBFloat16: return Adasum<BHalf>(c, b, counts, chunk).run();
    default:
      throw Error(Code::kInvalid, std::string("adasum: dtype ") + dtype_name(dt) +
                                      " is not a floating point type (Adasum reduces float16, bfloat16, "
                                      "float32 and float64)");
  }
}

}  // namespace appliance
