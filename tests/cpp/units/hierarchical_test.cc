// The hierarchical collectives' cost model (collectives/hierarchical.cc): when they are chosen.
#include <gtest/gtest.h>

#include "collectives/collectives.h"

namespace appliance {
namespace {

TEST(Hierarchical, never_with_one_host_or_one_rank_per_host) {
  for (size_t n : {size_t{4} << 10, size_t{64} << 20}) {
    EXPECT_FALSE(hierarchical_wins(8, 1, n)) << n;
    EXPECT_FALSE(hierarchical_wins(1, 8, n)) << n;
    EXPECT_FALSE(hierarchical_allgather_wins(8, 1, n)) << n;
    EXPECT_FALSE(hierarchical_allgather_wins(1, 8, n)) << n;
  }
}

TEST(Hierarchical, allreduce_wins_for_large_buffers_and_loses_for_small_ones) {
  EXPECT_FALSE(hierarchical_wins(4, 2, 4 << 10));   // recursive doubling: fewer steps
  EXPECT_TRUE(hierarchical_wins(4, 2, 64 << 20));   // less over the slow links
  EXPECT_TRUE(hierarchical_wins(8, 16, 64 << 20));
}

TEST(Hierarchical, allgather_wins_where_latency_dominates) {
  EXPECT_TRUE(hierarchical_allgather_wins(8, 16, 4 << 10));    // H-1 cross-host steps, not P-1
  EXPECT_FALSE(hierarchical_allgather_wins(8, 16, 64 << 20));  // the leaders carry it all, then broadcast
}

}  // namespace
}  // namespace appliance
