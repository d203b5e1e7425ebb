// Fusion (fusion/fusion.h): several small tensors back to back in one buffer and out again,
// zeros for a joined rank's missing inputs, and a scratch buffer that only grows.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>

#include "fusion/fusion.h"

namespace appliance {
namespace {

TEST(Fusion, packs_pieces_back_to_back_and_unpacks_them_where_they_belong) {
  std::vector<uint8_t> a(5), b(3), c(7);
  std::iota(a.begin(), a.end(), 1);
  std::iota(b.begin(), b.end(), 10);
  std::iota(c.begin(), c.end(), 20);
  std::vector<uint8_t> oa(5), ob(3), oc(7);
  std::vector<FusedPiece> pieces{{a.data(), oa.data(), 5}, {b.data(), ob.data(), 3}, {c.data(), oc.data(), 7}};
  std::vector<uint8_t> buf(15, 0xee);
  EXPECT_EQ(fusion_pack(buf.data(), pieces), 15u);
  EXPECT_EQ(buf[0], 1);
  EXPECT_EQ(buf[5], 10);
  EXPECT_EQ(buf[8], 20);
  EXPECT_EQ(buf[14], 26);
  fusion_unpack(buf.data(), pieces);
  EXPECT_EQ(oa, a);
  EXPECT_EQ(ob, b);
  EXPECT_EQ(oc, c);
}

TEST(Fusion, a_missing_input_contributes_zeros_and_a_missing_output_is_skipped) {
  std::vector<uint8_t> a{1, 2}, out{9, 9};
  std::vector<FusedPiece> pieces{{nullptr, nullptr, 3}, {a.data(), out.data(), 2}};
  std::vector<uint8_t> buf(5, 0xee);
  EXPECT_EQ(fusion_pack(buf.data(), pieces), 5u);
  EXPECT_EQ(buf, (std::vector<uint8_t>{0, 0, 0, 1, 2}));
  buf[3] = 7;
  fusion_unpack(buf.data(), pieces);
  EXPECT_EQ(out, (std::vector<uint8_t>{7, 2}));
}

TEST(ScratchBuffer, is_aligned_grows_to_the_largest_request_and_is_reused) {
  ScratchBuffer s;
  uint8_t* p = s.reserve(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_GE(s.capacity(), 100u);
  EXPECT_EQ(s.reserve(50), p);  // smaller: same memory
  uint8_t* q = s.reserve(1 << 20);
  EXPECT_GE(s.capacity(), size_t{1} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(q) % 64, 0u);
  EXPECT_EQ(s.reserve(4096), q);
}

}  // namespace
}  // namespace appliance
