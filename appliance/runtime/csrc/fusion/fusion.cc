// The fusion scratch buffer, and packing small tensors into it and out again (see fusion.h).
#include "fusion/fusion.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace appliance {

void ScratchBuffer::Free::operator()(uint8_t* p) const { std::free(p); }

uint8_t* ScratchBuffer::reserve(size_t bytes) {
  if (bytes <= cap_ && mem_) return mem_.get();
  size_t cap = cap_ ? cap_ : 4096;
  while (cap < bytes) cap *= 2;
  void* p = nullptr;
  if (posix_memalign(&p, 64, cap) != 0) throw std::bad_alloc();
  mem_.reset(static_cast<uint8_t*>(p));
  cap_ = cap;
  return mem_.get();
}

size_t fusion_pack(uint8_t* buf, const std::vector<FusedPiece>& pieces) {
  size_t off = 0;
  for (const FusedPiece& p : pieces) {
    if (p.src) std::memcpy(buf + off, p.src, p.bytes);
    else std::memset(buf + off, 0, p.bytes);
    off += p.bytes;
  }
  return off;
}

void fusion_unpack(const uint8_t* buf, const std::vector<FusedPiece>& pieces) {
  size_t off = 0;
  for (const FusedPiece& p : pieces) {
    if (p.dst) std::memcpy(p.dst, buf + off, p.bytes);
    off += p.bytes;
  }
}

}  // namespace appliance
