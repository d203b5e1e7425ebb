// The handle table: adding, completing, polling and waiting for operations (see ops.h).
#include "ops/ops.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "transport/backoff.h"

namespace appliance {

bool HandleTable::waited_within(int64_t us) const {
  return waiters_.load() > 0 || steady_us() - last_wait_us_.load() < us;
}

uint8_t* OpState::allocate_output(size_t bytes, std::vector<int64_t> shape) {
  output = allocate_block(pool, bytes);
  output_bytes = bytes;
  out_shape = std::move(shape);
  return output->data();
}

int HandleTable::add(const OpPtr& op, size_t* outstanding) {
  std::lock_guard<std::mutex> g(mu_);
  if (outstanding) *outstanding = names_.size();
  if (names_.count(op->req.name))
    throw std::invalid_argument("a " + std::string(op_kind_name(op->req.sig.kind)) + " named '" + op->req.name +
                                "' is already in flight on this rank; a name is free again once its operation completes");
  op->handle = next_++;
  if (!blocked_.empty()) last_change_us_ = steady_us();  // only a stuck caller reads it
  ops_[op->handle] = op;
  names_[op->req.name] = op->handle;
  return op->handle;
}

void HandleTable::complete(const OpPtr& op, Status s) { complete_all({op}, s); }

void HandleTable::complete_all(const std::vector<OpPtr>& ops, const Status& s) {
  std::vector<OpPtr> callbacks;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!blocked_.empty()) last_change_us_ = steady_us();  // only a stuck caller reads it
    for (const OpPtr& op : ops) {
      if (!op || op->done) continue;
      op->status = s;
      op->done.store(true, std::memory_order_release);
      auto it = names_.find(op->req.name);
      if (it != names_.end() && it->second == op->handle) names_.erase(it);
      if (op->on_done) {
        ops_.erase(op->handle);  // nobody waits for it
        callbacks.push_back(op);
      }
    }
  }
  cv_.notify_all();
  run_callbacks(callbacks);
}

void HandleTable::run_callbacks(std::vector<OpPtr>& ops) {
  for (OpPtr& op : ops) {
    auto fn = std::move(op->on_done);  // once; and what it captured goes with it
    op->on_done = nullptr;
    fn(op);
  }
}

bool HandleTable::poll(int handle) { return find(handle)->done.load(std::memory_order_acquire); }

OpPtr HandleTable::find(int handle) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = ops_.find(handle);
  if (it == ops_.end()) throw std::invalid_argument("unknown handle " + std::to_string(handle));
  return it->second;
}

void HandleTable::mark_launched(const OpPtr& op) {
  {
    std::lock_guard<std::mutex> g(mu_);
    op->launched.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

OpPtr HandleTable::wait(int handle, bool until_launched, bool* finished, int64_t* now_us) {
  std::unique_lock<std::mutex> g(mu_);
  auto it = ops_.find(handle);
  if (it == ops_.end()) throw std::invalid_argument("unknown handle " + std::to_string(handle));
  OpPtr op = it->second;
  auto ready = [&] {
    return op->done.load(std::memory_order_acquire) ||
           (until_launched && op->launched.load(std::memory_order_acquire) && op->ready_event);
  };
  struct Waiting {
    HandleTable& t;
    int64_t now = 0;  // a reading still current (the op was done when the wait began), or 0
    explicit Waiting(HandleTable& table) : t(table) { ++t.waiters_; }
    ~Waiting() {
      if (!now) now = steady_us();
      t.last_wait_us_.store(now);
      --t.waiters_;
    }
  } waiting(*this);
  if (now_us && *now_us && ready()) waiting.now = *now_us;
  if (spin_us_ > 0 && !ready()) {
    // Poll the op's atomics without the mutex (the completing thread needs it), yielding the
    // CPU now and then: ranks and their threads may outnumber the cores.
    g.unlock();
    const int64_t until = steady_us() + spin_us_;
    for (unsigned i = 1; !ready(); ++i) {
      if (i % 32 == 0) {
        if (steady_us() >= until) break;
        sched_yield();
      } else {
        cpu_relax();
      }
    }
    g.lock();
  }
  if (!ready()) {  // it blocks: registered while it lasts (stuck_since_us)
    const int64_t began = steady_us();
    blocked_[handle] = began;
    bool long_wait = false;
    if (watch_after_us_ > 0 &&
        !cv_.wait_until(g, std::chrono::steady_clock::time_point(std::chrono::microseconds(began + watch_after_us_)), ready)) {
      long_wait = true;
      ++long_waits_;
      g.unlock();
      if (poke_) poke_();
      g.lock();
    }
    cv_.wait(g, ready);
    blocked_.erase(handle);
    if (long_wait) --long_waits_;
  }
  ops_.erase(handle);
  auto n = names_.find(op->req.name);
  if (n != names_.end() && n->second == handle) names_.erase(n);
  if (finished) *finished = op->done;
  if (now_us) {
    if (!waiting.now) waiting.now = steady_us();
    *now_us = waiting.now;
  }
  return op;
}

int64_t HandleTable::stuck_since_us() {
  std::lock_guard<std::mutex> g(mu_);
  int64_t oldest = -1;
  for (const auto& kv : blocked_) {
    auto it = ops_.find(kv.first);
    if (it == ops_.end()) continue;
    const OpState& op = *it->second;
    if (op.done.load(std::memory_order_acquire) || op.planned_us != 0) continue;  // done, or running
    if (oldest < 0 || kv.second < oldest) oldest = kv.second;
  }
  return oldest < 0 ? -1 : std::max(oldest, last_change_us_);
}

void HandleTable::fail_all(const Status& s) {
  std::vector<OpPtr> callbacks;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto it = ops_.begin(); it != ops_.end();) {
      OpState& op = *it->second;
      if (op.done.load()) {
        ++it;
        continue;
      }
      op.status = s;
      op.done.store(true, std::memory_order_release);
      if (op.on_done) {
        callbacks.push_back(it->second);
        it = ops_.erase(it);
      } else {
        ++it;
      }
    }
    names_.clear();
  }
  cv_.notify_all();
  run_callbacks(callbacks);
}

}  // namespace appliance
