// ShmSegment: one mapped POSIX shared-memory object holding the two rings of a rank pair.
//
// Layout: a header (magic, version, ring capacity) and two ShmRing control blocks, each
// field on its own cache line so producer and consumer never share one, then ring 0's bytes
// and ring 1's bytes. Ring 0 carries bytes from the creator (the lower rank of the pair) to
// the opener; ring 1 the other way. Capacity is a power of two; head and tail are free-running
// 64-bit byte counters (head - tail = bytes in the ring).
//
// Lifetime: the creator makes "/appliance.<pid>.<a>-<b>.<random>" with O_EXCL and mode 0600,
// reserves its pages with posix_fallocate (a full /dev/shm is an error here, not a SIGBUS
// later), maps it with every page mapped at once (MAP_POPULATE: the rings' first lap takes no
// page faults) and tells the opener its name over the authenticated socket (which maps it the
// same way); both unlink the name as soon as the opener has mapped it (or the setup fails),
// so nothing outlives the job in /dev/shm. The mapping lives as long as the last ShmLink holding it.
// Failure modes: Error(kInternal) with errno text naming the object and what failed.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace appliance {

struct alignas(64) ShmRing {
  alignas(64) std::atomic<uint64_t> head;              // written by the producer only
  alignas(64) std::atomic<uint64_t> tail;              // written by the consumer only
  alignas(64) std::atomic<uint32_t> consumer_waiting;  // consumer sleeps on the doorbell
  alignas(64) std::atomic<uint32_t> producer_waiting;  // producer sleeps (ring was full)
};

class ShmSegment {
 public:
  static constexpr uint64_t kMagic = 0x61706c2d73686d31ULL;  // "apl-shm1"

  // Create a new named object of two rings of `ring_bytes` (rounded up to a power of two,
  // at least 4 KiB) and map it.
  static ShmSegment* create(const std::string& name, uint64_t ring_bytes);
  // Map an object another rank created; checks magic and size.
  static ShmSegment* open(const std::string& name);
  // An unnamed segment (memfd) for pairs inside one process (tests).
  static ShmSegment* anonymous(uint64_t ring_bytes);
  static void unlink(const std::string& name);  // ENOENT is fine
  // A fresh unique name for the pair (a, b).
  static std::string make_name(int rank_a, int rank_b);

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  uint64_t capacity() const { return cap_; }
  ShmRing* ring(int i);
  uint8_t* data(int i);

 private:
  ShmSegment(void* base, size_t bytes, uint64_t cap) : base_(base), bytes_(bytes), cap_(cap) {}
  static ShmSegment* map_fd(int fd, const std::string& what, uint64_t cap, bool init);
  void* base_;
  size_t bytes_;
  uint64_t cap_;
};

}  // namespace appliance
