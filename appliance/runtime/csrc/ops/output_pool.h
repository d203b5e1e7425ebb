// OutputPool: recycles the large host buffers the core allocates for outputs whose size is
// known only after negotiation (allgather, alltoall, reducescatter), which Python then owns
// as numpy arrays.
//
// Why: a fresh large buffer costs a page fault per 4 KiB page on first touch (a 64 MiB output:
// 16384 faults, more time than copying it), and the background thread's malloc arena cannot
// keep blocks over 64 MiB, so without a pool every large output is mapped, faulted in and
// unmapped again. A Block hands its memory back when its owner (the numpy array's capsule)
// lets go; the pool keeps at most kKeepBytes idle, most recently returned first, and reuses a
// block for a request of at least half its size. Blocks under kMinBytes bypass the pool
// (malloc serves them well). Thread-safe: blocks are taken on the background thread and
// returned on whichever thread drops the array; a block may outlive the Runtime (its pool
// stays alive while blocks point to it).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>

namespace appliance {

class OutputPool : public std::enable_shared_from_this<OutputPool> {
 public:
  static constexpr size_t kMinBytes = size_t{1} << 20;
  static constexpr size_t kKeepBytes = size_t{256} << 20;

  class Block {
   public:
    Block(std::unique_ptr<uint8_t[]> mem, size_t cap, std::shared_ptr<OutputPool> home)
        : mem_(std::move(mem)), cap_(cap), home_(std::move(home)) {}
    ~Block();
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;
    uint8_t* data() const { return mem_.get(); }

   private:
    std::unique_ptr<uint8_t[]> mem_;
    size_t cap_;
    std::shared_ptr<OutputPool> home_;  // null: not pooled (small, or no pool)
  };

  // A block of at least `bytes` (not zeroed): an idle one when one fits, else a new one.
  std::unique_ptr<Block> take(size_t bytes);
  size_t idle_bytes() const;
  uint64_t reused() const { return reused_.load(); }  // takes served by an idle block

 private:
  void give_back(std::unique_ptr<uint8_t[]> mem, size_t cap);

  struct Idle {
    std::unique_ptr<uint8_t[]> mem;
    size_t cap;
  };
  mutable std::mutex mu_;
  std::list<Idle> idle_;  // most recently returned first
  size_t idle_bytes_ = 0;
  std::atomic<uint64_t> reused_{0};
};

// Allocates `bytes` from `pool`, or plainly when pool is null.
std::unique_ptr<OutputPool::Block> allocate_block(const std::shared_ptr<OutputPool>& pool, size_t bytes);

}  // namespace appliance
