// shm_hops: the cost of one ring message between two processes on two cores, and of the small
// operation's exchanges built from such messages, with each way of waiting the engine uses.
// For benchmarks/hops.py; not a test of correctness.
//
// The calling process forks one child; the parent pins itself to cpus[0] (its affinity is
// restored after), the child to cpus[1]. They talk over two real ShmLink pairs (a control ring
// and a data ring, as a rank pair has), created before the fork (memfd segments, socketpair
// doorbells). Modes:
//   pingpong: A sends `nbytes` on the data ring, B returns them; each message carries its send
//             time (CLOCK_MONOTONIC, one clock for both processes), so each direction's one-way
//             latency is measured, not halved from a round trip.
//   op1:      an operation with no negotiation (OpenMPI vader's shape at 2 ranks): both send
//             `nbytes`, receive the peer's, and sum float32 into an output.
//   op3:      the cached operation of our engine at 2 ranks: B (rank 1) sends a READY of 32 bytes
//             on the control ring, A (rank 0) waits for it and sends a PLAN of 48 bytes, B waits
//             for that, then op1.
// Waits (every wait of a mode, both sides):
//   spin:     poll the ring with a pause between polls;
//   yield:    sched_yield between polls;
//   doorbell: arm the ring's waiting flag and poll() its doorbell socket at once;
//   backoff:  the data exchange's wait (collectives/comm.cc): Backoff's 64 spin rounds and 32
//             yield rounds, then arm and poll();
//   drive:    control waits as a driving caller does (engine/scheduler.cc: a turn per poll, a
//             yield every 4 turns, the doorbell after `spin_us`), data waits as backoff.
// Per side it returns the per-operation (or per-message) times and, summed over the measured
// iterations, how many waits there were and the time spent spinning, yielding and blocked.
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "hooks/hooks.h"
#include "transport/backoff.h"
#include "transport/shm/shm_link.h"

namespace py = pybind11;

namespace appliance {

namespace {

int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

int64_t thread_minflt() {
  rusage u;
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

enum class Wait { kSpin, kYield, kDoorbell, kBackoff, kDrive };

struct Phases {  // summed over the measured iterations of one side
  int64_t loop_ns = 0;  // wall time of the measured iterations
  int64_t minflt = 0;   // minor page faults of this side's thread in them (first touches of ring pages)
  int64_t waits = 0, polls = 0, yields = 0, blocks = 0;
  int64_t ns_spin = 0, ns_yield = 0, ns_block = 0;
  // Medians over the iterations of the time each spent spinning, yielding, blocked (the sums
  // above also hold the iterations in which other work took the core).
  int64_t med_spin = 0, med_yield = 0, med_block = 0;
};

int64_t median_of(std::vector<int64_t>& v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

constexpr int kMaxIters = 200000;
struct Shared {  // the child's results, in a shared anonymous mapping
  Phases phases;
  int ok;
  char error[256];
  int64_t samples[kMaxIters];
};

class Waiter {
 public:
  Waiter(Wait w, int64_t spin_us) : w_(w), spin_ns_(spin_us * 1000) {}
  Phases phases;
  bool counting = false;

  // Receives exactly `len` bytes from `link`, waiting as configured (`control`: a control wait).
  void recv(Link& link, void* data, size_t len, bool control) {
    uint8_t* p = static_cast<uint8_t*>(data);
    size_t got = link.recv_some(p, len);
    if (counting) ++phases.waits;
    if (got == len) return;
    const int64_t t0 = mono_ns();
    t_phase_ = t0;
    stage_ = 0;
    // drive: control waits as a driving caller, data waits as the data exchange (backoff).
    const Wait w = w_ == Wait::kDrive && !control ? Wait::kBackoff : w_;
    uint32_t round = 0;  // Backoff's rounds (transport/backoff.h)
    unsigned turns = 0;
    while (got < len) {
      if (counting) ++phases.polls;
      switch (w) {
        case Wait::kSpin:
          spin();
          break;
        case Wait::kYield:
          yield();
          break;
        case Wait::kDoorbell:
          block(link);
          break;
        case Wait::kBackoff:
          if (round < Backoff::kSpins) spin();
          else if (round < Backoff::kSpins + Backoff::kYields) yield();
          else block(link);
          ++round;
          break;
        case Wait::kDrive:
          if (mono_ns() - t0 >= spin_ns_) block(link);
          else if (++turns % 4 == 0) yield();
          else spin();
          break;
      }
      got += link.recv_some(p + got, len - got);
    }
    enter(-1);
  }

  static void send(Link& link, const void* data, size_t len) {
    size_t put = 0;
    while (put < len) {
      const size_t n = link.send_some(static_cast<const uint8_t*>(data) + put, len - put);
      put += n;
      if (!n) cpu_relax();
    }
  }

 private:
  // Charges the time since the last change to the stage it was in, and enters `s` (-1: done).
  void enter(int s) {
    if (s == stage_) return;
    const int64_t t = mono_ns();
    if (counting) (stage_ == 0 ? phases.ns_spin : stage_ == 1 ? phases.ns_yield : phases.ns_block) += t - t_phase_;
    t_phase_ = t;
    stage_ = s;
  }
  void spin() {
    enter(0);
    for (int i = 0; i < 16; ++i) cpu_relax();
  }
  void yield() {
    enter(1);
    if (counting) ++phases.yields;
    sched_yield();
  }
  void block(Link& link) {
    enter(2);
    if (counting) ++phases.blocks;
    if (link.arm_wait(true, false) == 0) return;
    pollfd fd{link.wait_handle(), POLLIN, 0};
    ::poll(&fd, 1, 100);
  }

  Wait w_;
  int64_t spin_ns_;
  int stage_ = 0;
  int64_t t_phase_ = 0;
};

Wait parse_wait(const std::string& s) {
  if (s == "spin") return Wait::kSpin;
  if (s == "yield") return Wait::kYield;
  if (s == "doorbell") return Wait::kDoorbell;
  if (s == "backoff") return Wait::kBackoff;
  if (s == "drive") return Wait::kDrive;
  throw std::invalid_argument("wait must be spin, yield, doorbell, backoff or drive, not '" + s + "'");
}

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0)
    throw std::invalid_argument("cannot bind to cpu " + std::to_string(cpu) + ": " + std::strerror(errno));
}

// One side's loop. a: the parent (rank 0). Returns per-iteration samples (ns).
std::vector<int64_t> run_side(bool a, const std::string& mode, Link& ctrl, Link& data, size_t nbytes, int warmup,
                              int iters, Waiter& wt) {
  const size_t n = std::max<size_t>(nbytes, 16);
  std::vector<uint8_t> out_buf(n), in_buf(n), sum(n);
  for (size_t i = 0; i < n; ++i) out_buf[i] = static_cast<uint8_t>(i);
  uint8_t ready[32] = {}, plan[48] = {};
  std::vector<int64_t> samples;
  samples.reserve(iters);
  int64_t start = 0;
  std::vector<int64_t> spin, yield, block;
  for (int it = 0; it < warmup + iters; ++it) {
    const Phases before = wt.phases;
    wt.counting = it >= warmup;
    if (it == warmup) {
      start = mono_ns();
      wt.phases.minflt = -thread_minflt();
    }
    struct Record {  // the iteration's wait phases, however it ends
      Waiter& wt;
      const Phases& before;
      std::vector<int64_t>& spin;
      std::vector<int64_t>& yield;
      std::vector<int64_t>& block;
      ~Record() {
        if (!wt.counting) return;
        spin.push_back(wt.phases.ns_spin - before.ns_spin);
        yield.push_back(wt.phases.ns_yield - before.ns_yield);
        block.push_back(wt.phases.ns_block - before.ns_block);
      }
    } record{wt, before, spin, yield, block};
    if (mode == "pingpong") {
      if (a) {
        int64_t t = mono_ns();
        std::memcpy(out_buf.data(), &t, 8);
        Waiter::send(data, out_buf.data(), n);
        wt.recv(data, in_buf.data(), n, false);
        const int64_t now = mono_ns();
        std::memcpy(&t, in_buf.data(), 8);
        if (wt.counting) samples.push_back(now - t);  // B -> A
      } else {
        wt.recv(data, in_buf.data(), n, false);
        const int64_t now = mono_ns();
        int64_t t;
        std::memcpy(&t, in_buf.data(), 8);
        if (wt.counting) samples.push_back(now - t);  // A -> B
        t = mono_ns();
        std::memcpy(out_buf.data(), &t, 8);
        Waiter::send(data, out_buf.data(), n);
      }
      continue;
    }
    const int64_t t0 = mono_ns();
    if (mode == "op3") {
      if (a) {
        wt.recv(ctrl, ready, sizeof ready, true);
        Waiter::send(ctrl, plan, sizeof plan);
      } else {
        Waiter::send(ctrl, ready, sizeof ready);
        wt.recv(ctrl, plan, sizeof plan, true);
      }
    }
    Waiter::send(data, out_buf.data(), n);
    wt.recv(data, in_buf.data(), n, false);
    const float* x = reinterpret_cast<const float*>(out_buf.data());
    const float* y = reinterpret_cast<const float*>(in_buf.data());
    float* z = reinterpret_cast<float*>(sum.data());
    for (size_t i = 0; i < n / 4; ++i) z[i] = x[i] + y[i];
    if (wt.counting) samples.push_back(mono_ns() - t0);
  }
  wt.phases.loop_ns = mono_ns() - start;
  wt.phases.minflt += thread_minflt();
  wt.phases.med_spin = median_of(spin);
  wt.phases.med_yield = median_of(yield);
  wt.phases.med_block = median_of(block);
  return samples;
}

py::dict phases_dict(const Phases& p) {
  py::dict d;
  d["loop_ns"] = p.loop_ns;
  d["minflt"] = p.minflt;
  d["waits"] = p.waits;
  d["polls"] = p.polls;
  d["yields"] = p.yields;
  d["blocks"] = p.blocks;
  d["ns_spin"] = p.ns_spin;
  d["ns_yield"] = p.ns_yield;
  d["ns_block"] = p.ns_block;
  d["med_spin"] = p.med_spin;
  d["med_yield"] = p.med_yield;
  d["med_block"] = p.med_block;
  return d;
}

py::dict shm_hops(const std::string& mode, const std::string& wait, size_t nbytes, int iters, int warmup,
                  std::vector<int> cpus, int64_t spin_us) {
  if (mode != "pingpong" && mode != "op1" && mode != "op3")
    throw std::invalid_argument("mode must be pingpong, op1 or op3, not '" + mode + "'");
  const Wait w = parse_wait(wait);
  if (iters < 1 || iters > kMaxIters) throw std::invalid_argument("iters must be 1.." + std::to_string(kMaxIters));
  if (cpus.size() != 2) throw std::invalid_argument("cpus must name two cpus");
  auto ctrl = make_shm_link_pair(0, 1, 1 << 16);
  auto data = make_shm_link_pair(0, 1, 1 << 20);
  void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) throw std::runtime_error("mmap failed");
  Shared* sh = new (mem) Shared();
  cpu_set_t saved;
  sched_getaffinity(0, sizeof saved, &saved);
  py::dict res;
  {
    py::gil_scoped_release nogil;
    const pid_t pid = fork();
    if (pid == 0) {
      try {
        pin(cpus[1]);
        ctrl.first.reset();
        data.first.reset();
        Waiter wt(w, spin_us);
        std::vector<int64_t> s = run_side(false, mode, *ctrl.second, *data.second, nbytes, warmup, iters, wt);
        std::memcpy(sh->samples, s.data(), s.size() * sizeof(int64_t));
        sh->phases = wt.phases;
        sh->ok = 1;
      } catch (const std::exception& e) {
        std::snprintf(sh->error, sizeof sh->error, "%s", e.what());
      }
      _exit(0);
    }
    ctrl.second.reset();
    data.second.reset();
    std::vector<int64_t> mine;
    Phases ph;
    std::string err;
    try {
      pin(cpus[0]);
      Waiter wt(w, spin_us);
      mine = run_side(true, mode, *ctrl.first, *data.first, nbytes, warmup, iters, wt);
      ph = wt.phases;
    } catch (const std::exception& e) {
      err = e.what();
      ctrl.first->close();
      data.first->close();
    }
    int status = 0;
    waitpid(pid, &status, 0);
    sched_setaffinity(0, sizeof saved, &saved);
    py::gil_scoped_acquire gil;
    if (!err.empty() || !sh->ok) {
      std::string e = err.empty() ? std::string(sh->error) : err;
      munmap(mem, sizeof(Shared));
      throw std::runtime_error("shm_hops: " + e);
    }
    py::dict a, b;
    a["samples_ns"] = mine;
    a["phases"] = phases_dict(ph);
    b["samples_ns"] = std::vector<int64_t>(sh->samples, sh->samples + iters);
    b["phases"] = phases_dict(sh->phases);
    res["a"] = a;
    res["b"] = b;
  }
  munmap(mem, sizeof(Shared));
  return res;
}

}  // namespace

void bind_hops_hooks(py::module_& m) {
  m.def("shm_hops", &shm_hops, py::arg("mode"), py::arg("wait"), py::arg("nbytes"), py::arg("iters"),
        py::arg("warmup") = 200, py::arg("cpus") = std::vector<int>{0, 1}, py::arg("spin_us") = 100,
        "Two processes on two cpus over real shm rings: per-message or per-operation times and wait phases "
        "(benchmarks/hops.py).");
}

}  // namespace appliance
