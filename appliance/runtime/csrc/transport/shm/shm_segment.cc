// ShmSegment: create, open and map the shared object of a rank pair (see shm_segment.h).
#include "transport/shm/shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <random>

#include "common/status.h"

namespace appliance {

namespace {

struct SegHeader {
  uint64_t magic;
  uint64_t capacity;
};

constexpr size_t kRingsAt = 64;      // after the header line
constexpr size_t kDataAt = 4096;     // ring bytes start page-aligned
static_assert(kRingsAt + 2 * sizeof(ShmRing) <= kDataAt, "ring control blocks fit before the data");

size_t total_bytes(uint64_t cap) { return kDataAt + 2 * cap; }

[[noreturn]] void fail(const std::string& what, const std::string& name, int err) {
  throw Error(Code::kInternal, "shared memory: " + what + " " + name + ": " + std::strerror(err));
}

uint64_t round_cap(uint64_t bytes) {
  uint64_t c = 4096;
  while (c < bytes && c < (uint64_t{1} << 40)) c <<= 1;
  return c;
}

}  // namespace

ShmSegment* ShmSegment::map_fd(int fd, const std::string& what, uint64_t cap, bool init) {
  const size_t bytes = total_bytes(cap);
  // Every page mapped now (MAP_POPULATE), in one pass: else each ring's first lap takes a page
  // fault per page on each side, on the path of the first operations a link carries.
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) fail("cannot map", what, err);
  if (init) {
    auto* h = static_cast<SegHeader*>(base);
    h->capacity = cap;
    for (int i = 0; i < 2; ++i) {
      auto* r = new (static_cast<uint8_t*>(base) + kRingsAt + i * sizeof(ShmRing)) ShmRing;
      r->head.store(0);
      r->tail.store(0);
      r->consumer_waiting.store(0);
      r->producer_waiting.store(0);
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
    h->magic = kMagic;  // last: an opener that sees the magic sees initialised rings
  }
  return new ShmSegment(base, bytes, cap);
}

ShmSegment* ShmSegment::create(const std::string& name, uint64_t ring_bytes) {
  const uint64_t cap = round_cap(ring_bytes);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) fail("cannot create", name, errno);
  if (ftruncate(fd, static_cast<off_t>(total_bytes(cap))) != 0) {
    int err = errno;
    ::close(fd);
    unlink(name);
    fail("cannot size", name, err);
  }
  // Reserve the pages now: a full /dev/shm fails here with ENOSPC rather than killing the
  // job with SIGBUS at the first touch of a missing page.
  int rc = posix_fallocate(fd, 0, static_cast<off_t>(total_bytes(cap)));
  if (rc != 0) {
    ::close(fd);
    unlink(name);
    fail("cannot reserve " + std::to_string(total_bytes(cap) >> 10) + " KiB for", name, rc);
  }
  try {
    return map_fd(fd, name, cap, true);
  } catch (...) {
    unlink(name);
    throw;
  }
}

ShmSegment* ShmSegment::open(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) fail("cannot open", name, errno);
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kDataAt)) {
    ::close(fd);
    throw Error(Code::kInternal, "shared memory: " + name + " is too small to be a segment");
  }
  SegHeader h{};
  if (pread(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h) || h.magic != kMagic ||
      static_cast<off_t>(total_bytes(h.capacity)) != st.st_size) {
    ::close(fd);
    throw Error(Code::kInternal, "shared memory: " + name + " is not a segment of this version");
  }
  return map_fd(fd, name, h.capacity, false);
}

ShmSegment* ShmSegment::anonymous(uint64_t ring_bytes) {
  const uint64_t cap = round_cap(ring_bytes);
  int fd = memfd_create("appliance-shm", MFD_CLOEXEC);
  if (fd < 0) fail("cannot create", "memfd", errno);
  if (ftruncate(fd, static_cast<off_t>(total_bytes(cap))) != 0) {
    int err = errno;
    ::close(fd);
    fail("cannot size", "memfd", err);
  }
  return map_fd(fd, "memfd", cap, true);
}

void ShmSegment::unlink(const std::string& name) { shm_unlink(name.c_str()); }

std::string ShmSegment::make_name(int rank_a, int rank_b) {
  std::random_device rd;
  char tag[17];
  snprintf(tag, sizeof tag, "%08x%08x", rd(), rd());
  return "/appliance." + std::to_string(getpid()) + "." + std::to_string(rank_a) + "-" + std::to_string(rank_b) + "." +
         tag;
}

ShmSegment::~ShmSegment() { munmap(base_, bytes_); }

ShmRing* ShmSegment::ring(int i) {
  return reinterpret_cast<ShmRing*>(static_cast<uint8_t*>(base_) + kRingsAt + i * sizeof(ShmRing));
}

uint8_t* ShmSegment::data(int i) { return static_cast<uint8_t*>(base_) + kDataAt + static_cast<size_t>(i) * cap_; }

}  // namespace appliance
