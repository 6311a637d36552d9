#include <catch2/catch.hpp>

#include <cstdint>
#include <utility>
#include <vector>

#include "lowbit/codec/packer.hpp"
#include "test_random.hpp"

namespace {

// Bit-by-bit reference of the dense little-endian stream: code i at bits [i*b, (i+1)*b).
std::vector<std::uint8_t> reference_stream(const std::vector<std::uint32_t>& codes, int b) {
  std::vector<std::uint8_t> bytes((codes.size() * b + 7) / 8 + 4, 0);
  for (std::size_t i = 0; i < codes.size(); ++i)
    for (int k = 0; k < b; ++k)
      if ((codes[i] >> k) & 1u) {
        const std::size_t bit = i * b + k;
        bytes[bit / 8] |= static_cast<std::uint8_t>(1u << (bit % 8));
      }
  return bytes;
}

template <int B>
void check_width(std::size_t count, std::uint64_t salt) {
  auto g = lowbit::test::rng(salt);
  std::vector<std::uint32_t> codes(count);
  // Every code of the width appears when count >= 2^B; the rest are random.
  for (std::size_t i = 0; i < count; ++i)
    codes[i] = (i < (1u << B) ? static_cast<std::uint32_t>(i) : static_cast<std::uint32_t>(g())) &
               ((1u << B) - 1u);
  const std::size_t groups = (count + 31) / 32;
  std::vector<std::uint32_t> words(groups * B);
  for (std::size_t grp = 0; grp < groups; ++grp) {
    std::uint32_t in[32] = {}, out[B];
    for (int i = 0; i < 32 && grp * 32 + i < count; ++i) in[i] = codes[grp * 32 + i];
    lowbit::pack::pack_group<B>(in, out);
    for (int j = 0; j < B; ++j) words[grp * B + j] = out[j];
  }
  // Layout: byte-identical to the reference stream (little-endian words).
  const auto ref = reference_stream(codes, B);
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(words.data());
  for (std::size_t i = 0; i < (count * B + 7) / 8; ++i) REQUIRE(bytes[i] == ref[i]);
  // Round trip.
  for (std::size_t grp = 0; grp < groups; ++grp) {
    std::uint32_t in[B], out[32];
    for (int j = 0; j < B; ++j) in[j] = words[grp * B + j];
    lowbit::pack::unpack_group<B>(in, out);
    for (int i = 0; i < 32 && grp * 32 + i < count; ++i) REQUIRE(out[i] == codes[grp * 32 + i]);
  }
}

template <int... B>
void check_all_widths(std::size_t count, std::integer_sequence<int, B...>) {
  (check_width<B + 1>(count, count * 31 + B), ...);
}

}  // namespace

TEST_CASE("every code of every width 1..16 packs and unpacks exactly") {
  // pack_group always takes 32 codes: counts that end a group early, fill it, and many
  // groups (a count of 0 would call it on nothing and check nothing).
  const std::size_t count = GENERATE(as<std::size_t>{}, 1, 31, 127, 128, 129, 100003);
  INFO("count " << count);
  check_all_widths(count, std::make_integer_sequence<int, 16>{});
}

TEST_CASE("a 32-code group fills exactly `bits` words") {
  std::uint32_t codes[32], words[3], back[32];
  for (int i = 0; i < 32; ++i) codes[i] = 7u;  // all ones at 3 bits
  lowbit::pack::pack_group<3>(codes, words);
  REQUIRE(words[0] == 0xffffffffu);
  REQUIRE(words[1] == 0xffffffffu);
  REQUIRE(words[2] == 0xffffffffu);
  lowbit::pack::unpack_group<3>(words, back);
  for (int i = 0; i < 32; ++i) REQUIRE(back[i] == 7u);
}
