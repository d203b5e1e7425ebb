// Fusion: several small allreduces of one dtype run as one, through a reusable buffer.
// The layout is the entries' bytes back to back in plan order (same dtype, so every offset
// stays aligned to the element size). The buffer grows to the largest batch seen and is
// reused, so the steady state allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace appliance {

class ScratchBuffer {
 public:
  // At least `bytes` of 64-byte aligned memory; contents are not preserved across calls.
  uint8_t* reserve(size_t bytes);
  size_t capacity() const { return cap_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> mem_;
  size_t cap_ = 0;
};

struct FusedPiece {
  const void* src;  // nullptr: contribute zeros (a joined rank)
  void* dst;        // nullptr: nothing to copy out
  size_t bytes;
};

// Copies every piece into buf back to back (zeros for src == nullptr); returns total bytes.
size_t fusion_pack(uint8_t* buf, const std::vector<FusedPiece>& pieces);
void fusion_unpack(const uint8_t* buf, const std::vector<FusedPiece>& pieces);

}  // namespace appliance
