// frame_header and first_difference on the host: the field each disagreement is named by,
// in the order the error names them, and the layout the kernels read as eight words
// (kernels/frame_check.cuh compares word by word and must agree with this function).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>

#include "lowbit/codec/frame_header.hpp"

namespace {

using lowbit::detail::first_difference;
using lowbit::detail::frame_header;
using lowbit::detail::header_field;

frame_header call(std::uint32_t rank) {
  frame_header h;
  h.magic = lowbit::detail::frame_magic;
  h.config = 0xabcdef01u;
  h.count = (std::uint64_t{1} << 40) + 1000;  // both halves of the count matter
  h.step = 9;
  h.seq = 4;
  h.bits = 4;
  h.rank = rank;
  return h;
}

}  // namespace

TEST_CASE("first_difference names the first field that differs") {
  const frame_header want = call(0);
  REQUIRE(first_difference(call(2), want, 2) == header_field::none);

  struct edit {
    header_field field;
    void (*apply)(frame_header&);
  };
  const edit edits[] = {
      {header_field::magic, [](frame_header& h) { h.magic = 0; }},
      {header_field::rank, [](frame_header& h) { h.rank = 3; }},
      {header_field::poisoned, [](frame_header& h) { h.flags |= lowbit::detail::poisoned; }},
      {header_field::count, [](frame_header& h) { h.count += 20; }},
      {header_field::count, [](frame_header& h) { h.count ^= std::uint64_t{1} << 40; }},
      {header_field::bits, [](frame_header& h) { h.bits = 2; }},
      {header_field::config, [](frame_header& h) { h.config ^= 1; }},
      {header_field::step, [](frame_header& h) { h.step += 1; }},
      {header_field::seq, [](frame_header& h) { h.seq += 1; }},
  };
  for (const edit& e : edits) {
    frame_header got = call(2);
    e.apply(got);
    CHECK(first_difference(got, want, 2) == e.field);
  }
  SECTION("the earlier field wins when several differ") {
    frame_header got = call(2);
    got.seq += 1;
    got.count += 1;
    CHECK(first_difference(got, want, 2) == header_field::count);
    got.magic = 1;
    CHECK(first_difference(got, want, 2) == header_field::magic);
  }
  SECTION("flags other than poisoned mean nothing") {
    frame_header got = call(2);
    got.flags = 0x8000;
    CHECK(first_difference(got, want, 2) == header_field::none);
  }
  SECTION("the receiver's own rank field is not compared") {
    frame_header mine = want;
    mine.rank = 7;
    CHECK(first_difference(call(2), mine, 2) == header_field::none);
  }
}

TEST_CASE(
    "a header is eight little-endian words: magic, config, count lo/hi, step, seq, "
    "bits | flags << 16, rank") {
  frame_header h = call(5);
  h.flags = lowbit::detail::poisoned;
  std::uint32_t w[8];
  static_assert(sizeof w == sizeof h);
  std::memcpy(w, &h, sizeof h);
  CHECK(w[0] == lowbit::detail::frame_magic);
  CHECK(w[1] == h.config);
  CHECK(w[2] == static_cast<std::uint32_t>(h.count));
  CHECK(w[3] == static_cast<std::uint32_t>(h.count >> 32));
  CHECK(w[4] == h.step);
  CHECK(w[5] == h.seq);
  CHECK(w[6] == (h.bits | (std::uint32_t{h.flags} << 16)));
  CHECK(w[7] == 5u);
}
