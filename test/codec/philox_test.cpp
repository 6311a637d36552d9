#include <catch2/catch.hpp>

#include "lowbit/codec/philox.hpp"

// Known-answer vectors of Philox4x32-10 from Random123's kat_vectors.
TEST_CASE("philox4x32-10 matches the Random123 known answers") {
  auto r = lowbit::philox4x32<10>({{0, 0, 0, 0}}, 0, 0);
  CHECK(r.w[0] == 0x6627e8d5u);
  CHECK(r.w[1] == 0xe169c58du);
  CHECK(r.w[2] == 0xbc57ac4cu);
  CHECK(r.w[3] == 0x9b00dbd8u);
  r = lowbit::philox4x32<10>({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu,
                             0xffffffffu);
  CHECK(r.w[0] == 0x408f276du);
  CHECK(r.w[1] == 0x41c83b0eu);
  CHECK(r.w[2] == 0xa20bc7c6u);
  CHECK(r.w[3] == 0x6d5451fdu);
  r = lowbit::philox4x32<10>({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u,
                             0x299f31d0u);
  CHECK(r.w[0] == 0xd16cfe09u);
  CHECK(r.w[1] == 0x94fdcceBu);
  CHECK(r.w[2] == 0x5001e420u);
  CHECK(r.w[3] == 0x24126ea1u);
}

TEST_CASE("rng_key separates seeds, steps, ranks and stages") {
  const lowbit::rng_key base{42, 7, 1, 0};
  auto same = [](lowbit::philox_block a, lowbit::philox_block b) {
    return a.w[0] == b.w[0] && a.w[1] == b.w[1] && a.w[2] == b.w[2] && a.w[3] == b.w[3];
  };
  REQUIRE(same(base.draw(5), base.draw(5)));
  REQUIRE_FALSE(same(base.draw(5), base.draw(6)));
  REQUIRE_FALSE(same(base.draw(5), lowbit::rng_key{43, 7, 1, 0}.draw(5)));
  REQUIRE_FALSE(same(base.draw(5), lowbit::rng_key{42, 8, 1, 0}.draw(5)));
  REQUIRE_FALSE(same(base.draw(5), lowbit::rng_key{42, 7, 2, 0}.draw(5)));
  REQUIRE_FALSE(same(base.draw(5), lowbit::rng_key{42, 7, 1, 1}.draw(5)));
}
