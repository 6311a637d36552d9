// Codes left at bits [16, 32) of their words, as the stochastic encode kernel makes and
// packs them (round::stochastic::index_high, absmax::quantize_high,
// codec::quantize_group_high, pack::pack_group_high with its byte permutes), replayed on
// the host against the reference path: to_grid / quantize / quantize_group and pack_group.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "lowbit/codec/codec.hpp"
#include "lowbit/core/float_ops.hpp"
#include "lowbit/kernels/detail/lane_layout.cuh"
#include "lowbit/kernels/detail/tile_lanes.cuh"
#include "test_random.hpp"

using namespace lowbit;
using lowbit::detail::bits_float;
using lowbit::detail::float_bits;

namespace {

/// Floats the encoder can meet: nan (several payloads, both signs), +-inf, +-0,
/// subnormals, FLT_MIN and FLT_MAX and their neighbours, bfloat16's extremes (largest,
/// smallest normal and subnormal, each side of 1), powers of two, and random bit patterns
/// (every fourth a bfloat16, low half zero).
std::vector<float> special_floats() {
  std::vector<float> v;
  const std::uint32_t bits[] = {
      0x7fc00000u, 0xffc00000u, 0x7fffffffu, 0x7f800001u,
      0xff800001u, 0x7fff0000u,  // nan
      0x7f800000u, 0xff800000u,  // inf
      0x00000000u, 0x80000000u,  // zeros
      0x00000001u, 0x80000001u, 0x00000002u, 0x007fffffu,
      0x807fffffu, 0x00400000u,               // subnormal
      0x00800000u, 0x80800000u, 0x00800001u,  // FLT_MIN
      0x7f7fffffu, 0xff7fffffu, 0x7f7ffffeu, 0x7f7f0000u,
      0xff7f0000u, 0x7f7effffu,                            // FLT_MAX, bf16 max
      0x00010000u, 0x80010000u, 0x007f0000u, 0x00810000u,  // bf16 subnormal, min
      0x3f800000u, 0xbf800000u, 0x3f810000u, 0x3f7f0000u,
      0x3f7fffffu, 0x3f800001u,  // around 1
      0x4b000000u, 0x4affffffu, 0x43000000u, 0x42ff0000u};
  for (const std::uint32_t b : bits) v.push_back(bits_float(b));
  for (int e = -149; e <= 127; ++e) v.push_back(std::ldexp(1.0f, e));
  return v;
}

/// One block's values: mostly random at a random scale, with special values mixed in.
template <class G>
void fill_block(G& g, const std::vector<float>& specials, float (&x)[32]) {
  const int kind = static_cast<int>(g() % 8);
  const int e = static_cast<int>(g() % 300) - 160;  // scale exponent: subnormal .. overflow
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : x) {
    switch (kind) {
      case 0:  // one special value among random ones
      case 1:
        v = std::ldexp(u(g), std::min(e, 127));
        break;
      case 2:  // bfloat16 values
        v = bits_float(float_bits(std::ldexp(u(g), std::min(e, 127))) & 0xffff0000u);
        break;
      case 3:  // random bit patterns, finite ones mostly
        v = bits_float(static_cast<std::uint32_t>(g()));
        break;
      case 4:  // all the same magnitude (ties of every kind)
        v = (g() & 1) ? std::ldexp(1.0f, std::min(e, 127)) : -std::ldexp(1.0f, std::min(e, 127));
        break;
      case 5:  // zeros and subnormals
        v = bits_float(static_cast<std::uint32_t>(g() % 4 == 0 ? 0u : g() % 0x800000u) |
                       ((g() & 1) ? 0x80000000u : 0u));
        break;
      default:  // specials throughout
        v = specials[g() % specials.size()];
    }
  }
  if (kind == 0 || kind == 1) x[g() % 32] = specials[g() % specials.size()];
}

/// Blocks seen by check_codec: scaled, dividing, all-zero (no step), poisoned.
std::size_t (&block_kinds())[4] {
  static std::size_t k[4] = {};
  return k;
}

/// The reference (quantize_group then pack_group) against quantize_group_high then
/// pack_group_high, on many blocks; returns the values checked.
template <int Bits, class Grid>
std::size_t check_codec(std::uint64_t salt, int blocks) {
  using Q = quant::absmax<Bits, 128, Grid>;
  using C = codec<Q, round::stochastic>;
  static_assert(C::high_codes);
  auto g = lowbit::test::rng(salt);
  const std::vector<float> specials = special_floats();
  std::size_t checked = 0;
  for (int b = 0; b < blocks; ++b) {
    float x[32];
    fill_block(g, specials, x);
    const int valid = b % 5 == 0 ? static_cast<int>(g() % 33) : 32;
    quant::block_stats s;
    for (int i = 0; i < valid; ++i) s.add(x[i]);
    const auto meta = Q::make_meta(s);
    const auto p = Q::make_params(meta);
    ++block_kinds()[s.poisoned() ? 3 : meta.step == 0.0f ? 2 : p.divide ? 1 : 0];
    const rng_key key{g(), static_cast<std::uint32_t>(g()), static_cast<std::uint32_t>(g() % 8),
                      static_cast<std::uint32_t>(g() % 2)};
    const std::uint64_t index0 = (g() % (std::uint64_t{1} << 40)) * 32;
    std::uint32_t codes[32], raw[32];
    C::quantize_group(x, valid, p, key, index0, codes);
    C::quantize_group_high(x, valid, p, key, index0, raw);
    for (int i = 0; i < 32; ++i) {
      INFO("bits " << Bits << " x " << x[i] << " step " << meta.step << " i " << i);
      REQUIRE((raw[i] >> 16) == codes[i]);
      REQUIRE(codes[i] < (1u << Bits));
      if (i < valid) {  // and value by value, with the noise the group drew
        const philox_block r = key.draw(index0 / 16 + static_cast<std::uint64_t>(i / 16));
        const std::uint32_t noise = rng_key::noise16(r, i % 16);
        REQUIRE((Q::template quantize_high<round::stochastic>(x[i], p, noise) >> 16) ==
                Q::template quantize<round::stochastic>(x[i], p, noise));
      }
      ++checked;
    }
    std::uint32_t w_ref[Bits], w_high[Bits];
    C::pack(codes, w_ref);
    pack::pack_group_high<Bits>(raw, w_high);
    for (int j = 0; j < Bits; ++j) REQUIRE(w_high[j] == w_ref[j]);
  }
  return checked;
}

/// pack_group_high of codes with arbitrary bits below bit 16 against pack_group.
template <int Bits>
std::size_t check_pack(std::uint64_t salt, int groups) {
  auto g = lowbit::test::rng(salt);
  std::size_t checked = 0;
  for (int n = 0; n < groups; ++n) {
    std::uint32_t codes[32], raw[32];
    for (int i = 0; i < 32; ++i) {
      // Every code value of the width in the first groups, then random ones; the extremes
      // of the low half (0, 0xffff) as often as random ones.
      codes[i] = (n < (1 << Bits) / 32 + 1 ? static_cast<std::uint32_t>(32 * n + i)
                                           : static_cast<std::uint32_t>(g())) &
                 ((1u << Bits) - 1u);
      const std::uint32_t low = g() % 3 == 0   ? 0u
                                : g() % 2 == 0 ? 0xffffu
                                               : static_cast<std::uint32_t>(g() & 0xffffu);
      raw[i] = (codes[i] << 16) | low;
    }
    std::uint32_t w_ref[Bits], w_high[Bits];
    pack::pack_group<Bits>(codes, w_ref);
    pack::pack_group_high<Bits>(raw, w_high);
    for (int j = 0; j < Bits; ++j) REQUIRE(w_high[j] == w_ref[j]);
    checked += 32;
  }
  return checked;
}

template <int Lo, int Hi>
std::size_t check_index(float shift, std::uint64_t salt, int count) {
  auto g = lowbit::test::rng(salt);
  const std::vector<float> specials = special_floats();
  const float lo = static_cast<float>(Lo) - shift, hi = static_cast<float>(Hi) - shift;
  std::uniform_real_distribution<float> u(lo, hi);
  std::size_t checked = 0;
  for (int n = 0; n < count; ++n) {
    float p;
    switch (n % 4) {
      case 0:
        p = u(g);
        break;
      case 1:  // next to a multiple of 2^-16
        p = std::nextafter(std::ldexp(std::round(std::ldexp(u(g), 16)), -16),
                           (g() & 1) ? HUGE_VALF : -HUGE_VALF);
        break;
      case 2:
        p = specials[g() % specials.size()];
        break;
      default:
        p = bits_float(static_cast<std::uint32_t>(g()));
    }
    const auto noise = static_cast<std::uint32_t>(g() & 0xffffu);
    INFO("p " << p << " shift " << shift << " noise " << noise);
    const std::uint32_t code = round::to_grid<round::stochastic, Lo, Hi>(p, shift, noise);
    REQUIRE((round::to_grid_high<round::stochastic, Lo, Hi>(p, shift, noise) >> 16) == code);
    if (!(p != p)) {
      const float t = std::min(std::max(p, lo), hi);
      REQUIRE((round::to_grid_in_range_high<round::stochastic, Lo, Hi>(t, shift, noise) >> 16) ==
              code);
      if constexpr (Hi - Lo <= 128)  // what the device's index_high computes for such grids
        REQUIRE((round::stochastic::index_small_high<Lo>(t, shift, noise) >> 16) == code);
    }
    ++checked;
  }
  return checked;
}

}  // namespace

TEST_CASE("the device's byte permute, emulated on the host") {
  using pack::detail::byte_perm;
  const std::uint32_t a = 0x03020100u, b = 0x07060504u;
  REQUIRE(byte_perm(a, b, 0x3210u) == a);
  REQUIRE(byte_perm(a, b, 0x7654u) == b);
  REQUIRE(byte_perm(a, b, 0x0062u) == 0x00000602u);
  REQUIRE(byte_perm(a, b, 0x6200u) == 0x06020000u);
  REQUIRE(byte_perm(0xddccbbaau, 0x44332211u, 0x7610u) == 0x4433bbaau);
  REQUIRE(byte_perm(0x12345678u, 0u, 0x4404u) == 0x00007800u);  // rng_key::noise16's byte 0
}

TEST_CASE("stochastic::index_high leaves to_grid's index at bit 16") {
  std::size_t n = 0;
  n += check_index<-8, 7>(-0.5f, 1, 100000);
  n += check_index<-7, 7>(0.0f, 2, 100000);
  n += check_index<-1, 0>(-0.5f, 3, 50000);
  n += check_index<-2, 1>(-0.5f, 4, 50000);
  n += check_index<-64, 63>(-0.5f, 5, 50000);
  n += check_index<-128, 127>(-0.5f, 6, 50000);
  n += check_index<-127, 127>(0.0f, 7, 50000);
  n += check_index<-32768, 32767>(-0.5f, 8, 50000);
  REQUIRE(n == 500000);
}

TEST_CASE("pack_group_high packs codes at bit 16 as pack_group packs them at bit 0") {
  std::size_t n = 0;
  n += check_pack<1>(11, 4000);
  n += check_pack<2>(12, 4000);
  n += check_pack<3>(13, 4000);
  n += check_pack<4>(14, 4000);
  n += check_pack<5>(15, 4000);
  n += check_pack<7>(17, 4000);
  n += check_pack<8>(18, 4000);
  n += check_pack<12>(22, 4000);
  n += check_pack<16>(26, 4000);
  REQUIRE(n == 9 * 4000 * 32);
}

TEST_CASE("quantize_group_high and pack_group_high give quantize_group's frame words") {
  std::size_t n = 0;
  n += check_codec<1, quant::grid::full>(21, 4000);
  n += check_codec<2, quant::grid::full>(22, 4000);
  n += check_codec<2, quant::grid::zero>(23, 4000);
  n += check_codec<3, quant::grid::full>(24, 4000);
  n += check_codec<4, quant::grid::full>(25, 20000);
  n += check_codec<4, quant::grid::zero>(26, 8000);
  n += check_codec<5, quant::grid::full>(27, 2000);
  n += check_codec<8, quant::grid::full>(28, 8000);
  n += check_codec<8, quant::grid::zero>(29, 4000);
  n += check_codec<12, quant::grid::full>(30, 2000);
  n += check_codec<16, quant::grid::full>(31, 2000);
  n += check_codec<16, quant::grid::zero>(32, 2000);
  REQUIRE(n == std::size_t{64000} * 32);
  // Every kind of block came up: scaled, dividing (subnormal or huge steps), all-zero and
  // poisoned ones.
  for (int k = 0; k < 4; ++k) REQUIRE(block_kinds()[k] > 0);
}

TEST_CASE("lane_layout::lane_of_group is the written-out formula for every layout") {
  std::size_t n = 0;
  auto check = [&n](auto layout) {
    using L = decltype(layout);
    for (int g = 0; g < 4096; ++g, ++n)
      REQUIRE(L::lane_of_group(g) ==
              (g / L::groups_per_block) * L::lanes_per_block + g % L::groups_per_block);
  };
  check(kernels::detail::lane_layout<1>{});
  check(kernels::detail::lane_layout<2>{});
  check(kernels::detail::lane_layout<3>{});
  check(kernels::detail::lane_layout<4>{});
  check(kernels::detail::lane_layout<5>{});
  check(kernels::detail::lane_layout<8>{});
  check(kernels::detail::lane_layout<16>{});
  check(kernels::detail::lane_layout<32>{});
  REQUIRE(n == 8 * 4096);
}

TEST_CASE("make_codec_extent is what codec_walk derived from count") {
  using C = codec<quant::absmax<4>, round::stochastic>;
  using L = kernels::detail::lane_layout<C::groups_per_block>;
  auto g = lowbit::test::rng(41);
  std::size_t n = 0;
  for (int i = 0; i < 100000; ++i, ++n) {
    const std::size_t count = i < 5000 ? static_cast<std::size_t>(i)
                                       : static_cast<std::size_t>(g() % (std::uint64_t{1} << 40));
    const auto e = kernels::detail::make_codec_extent<C, L>(count);
    REQUIRE(e.blocks == C::num_blocks(count));
    REQUIRE(e.tiles == kernels::detail::tile_count<L>(C::num_blocks(count)));
    REQUIRE(e.codes_offset == C::codes_offset(count));
  }
  REQUIRE(n == 100000);
}
