// The launch policy table: a host test of a constexpr selector (no GPU needed).
#include <catch2/catch.hpp>

#include "lowbit/kernels/launch_policy.cuh"

using lowbit::kernels::is_valid;
using lowbit::kernels::launch_policy;
using lowbit::kernels::pass;
using lowbit::kernels::select_launch_policy;

static_assert(is_valid(select_launch_policy(9, 0)), "the Hopper policy must be launchable");
static_assert(select_launch_policy(9, 0).items_per_thread == 32,
              "one thread codes one packing group");

TEST_CASE("every compute capability gets a launchable policy", "[kernels][policy]") {
  for (int major = 3; major <= 12; ++major) {
    for (const pass k : {pass::encode, pass::decode, pass::reduce}) {
      const launch_policy p = select_launch_policy(major, 0, k);
      INFO("sm_" << major << "0, pass " << static_cast<int>(k) << ": " << p.threads_per_block
                 << " threads, " << p.blocks_per_sm << " CTAs/SM, " << p.waves << " waves");
      REQUIRE(is_valid(p));
      REQUIRE(p.threads_per_block <= launch_policy::max_threads);
    }
  }
}

TEST_CASE("malformed policies are rejected", "[kernels][policy]") {
  REQUIRE_FALSE(is_valid(launch_policy{48, 32, 1, 1}));
  REQUIRE_FALSE(is_valid(launch_policy{512, 32, 1, 1}));
  REQUIRE_FALSE(is_valid(launch_policy{256, 16, 1, 1}));
  REQUIRE_FALSE(is_valid(launch_policy{256, 32, 0, 1}));
}
