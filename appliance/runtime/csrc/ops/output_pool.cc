// OutputPool: taking large output blocks and giving them back when Python lets go (see
// output_pool.h).
#include "ops/output_pool.h"

namespace appliance {

namespace {
std::unique_ptr<OutputPool::Block> plain_block(size_t bytes) {  // not pooled: freed when dropped
  return std::make_unique<OutputPool::Block>(std::unique_ptr<uint8_t[]>(new uint8_t[bytes ? bytes : 1]), bytes, nullptr);
}
}  // namespace

OutputPool::Block::~Block() {
  if (home_ && mem_) home_->give_back(std::move(mem_), cap_);
}

std::unique_ptr<OutputPool::Block> OutputPool::take(size_t bytes) {
  if (bytes < kMinBytes) return plain_block(bytes);
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if (it->cap < bytes || it->cap / 2 > bytes) continue;  // too small, or would waste over half
      std::unique_ptr<uint8_t[]> mem = std::move(it->mem);
      const size_t cap = it->cap;
      idle_bytes_ -= cap;
      idle_.erase(it);
      ++reused_;
      return std::make_unique<Block>(std::move(mem), cap, shared_from_this());
    }
  }
  return std::make_unique<Block>(std::unique_ptr<uint8_t[]>(new uint8_t[bytes]), bytes, shared_from_this());
}

void OutputPool::give_back(std::unique_ptr<uint8_t[]> mem, size_t cap) {
  std::unique_ptr<uint8_t[]> drop;  // freed outside the lock
  std::list<Idle> evicted;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (cap > kKeepBytes) {
      drop = std::move(mem);
    } else {
      // Make room by dropping the blocks returned longest ago.
      while (idle_bytes_ + cap > kKeepBytes && !idle_.empty()) {
        idle_bytes_ -= idle_.back().cap;
        evicted.splice(evicted.end(), idle_, std::prev(idle_.end()));
      }
      idle_.push_front(Idle{std::move(mem), cap});
      idle_bytes_ += cap;
    }
  }
}

size_t OutputPool::idle_bytes() const {
  std::lock_guard<std::mutex> g(mu_);
  return idle_bytes_;
}

std::unique_ptr<OutputPool::Block> allocate_block(const std::shared_ptr<OutputPool>& pool, size_t bytes) {
  if (pool) return pool->take(bytes);
  return plain_block(bytes);
}

}  // namespace appliance
