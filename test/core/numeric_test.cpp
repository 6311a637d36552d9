#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

#include "lowbit/core/numeric.hpp"
#include "test_random.hpp"

using lowbit::detail::bf16_bits_to_float;
using lowbit::detail::float_bits;
using lowbit::detail::float_to_bf16_bits;
using lowbit::detail::float_to_half_bits;
using lowbit::detail::half_bits_to_float;

namespace {

// Reference float -> half: pick the nearer of the two neighbouring halves by exact
// double arithmetic, ties to the even code.
std::uint16_t reference_half(float x) {
  if (std::isnan(x)) return 0x7fff;
  const double d = x;
  std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(d);
  if (a >= 65520.0) return sign | 0x7c00;
  std::uint16_t best = 0;
  for (std::uint16_t lo = 0, hi = 0x7bff; lo <= hi;) {  // largest code with value <= a
    const std::uint16_t mid = static_cast<std::uint16_t>((lo + hi + 1) / 2);
    if (half_bits_to_float(mid) <= a) {
      best = mid;
      if (mid == hi) break;
      lo = mid;
    } else {
      hi = static_cast<std::uint16_t>(mid - 1);
    }
  }
  const double below = half_bits_to_float(best);
  const double above = half_bits_to_float(static_cast<std::uint16_t>(best + 1));
  std::uint16_t pick = best;
  if (a - below > above - a || (a - below == above - a && (best & 1))) pick = best + 1;
  return sign | pick;
}

}  // namespace

TEST_CASE("half conversion round-trips every half exactly") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = half_bits_to_float(bits);
    if (std::isnan(f)) {
      REQUIRE(float_to_half_bits(f) == 0x7fff);
    } else {
      REQUIRE(float_to_half_bits(f) == bits);
    }
  }
}

TEST_CASE("float to half rounds to nearest even, including subnormals and overflow") {
  auto g = lowbit::test::rng(1);
  std::uniform_int_distribution<std::uint32_t> d;
  for (int i = 0; i < 200000; ++i) {
    // random float bits with exponents near the half range
    std::uint32_t u = d(g);
    u = (u & 0x807fffffu) | ((100u + (u >> 23) % 50u) << 23);
    const float x = lowbit::detail::bits_float(u);
    REQUIRE(float_to_half_bits(x) == reference_half(x));
  }
  REQUIRE(float_to_half_bits(65519.99f) == 0x7bff);
  REQUIRE(float_to_half_bits(65520.0f) == 0x7c00);
  REQUIRE(float_to_half_bits(-std::numeric_limits<float>::infinity()) == 0xfc00);
}

TEST_CASE("float to bfloat16 rounds to nearest even") {
  REQUIRE(float_to_bf16_bits(1.0f) == 0x3f80);
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: goes to the even one, 1.
  REQUIRE(float_to_bf16_bits(1.00390625f) == 0x3f80);
  REQUIRE(float_to_bf16_bits(1.01171875f) == 0x3f82);  // 1 + 3*2^-8 ties up to even
  REQUIRE(float_to_bf16_bits(std::nanf("")) == 0x7fff);
  REQUIRE(std::isinf(bf16_bits_to_float(float_to_bf16_bits(3.4e38f))));
  auto values = lowbit::test::normal(10000, 100.0f);
  for (float x : values) {
    const float y = bf16_bits_to_float(float_to_bf16_bits(x));
    REQUIRE(std::fabs(y - x) <= std::ldexp(std::fabs(x), -8));
  }
}

TEST_CASE("numeric traits cover float, half and bfloat16") {
  STATIC_REQUIRE(lowbit::is_element_type_v<float>);
  STATIC_REQUIRE(lowbit::is_element_type_v<__half>);
  STATIC_REQUIRE(lowbit::is_element_type_v<__nv_bfloat16>);
  STATIC_REQUIRE_FALSE(lowbit::is_element_type_v<double>);
  STATIC_REQUIRE_FALSE(lowbit::is_element_type_v<int>);
  REQUIRE(lowbit::to_float(lowbit::from_float<__half>(0.5f)) == 0.5f);
  REQUIRE(lowbit::to_float(lowbit::from_float<__nv_bfloat16>(-2.0f)) == -2.0f);
}
