// The host's product rounded towards zero against its definition, checked with exact
// double arithmetic (a float product is exact in a double).
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "lowbit/core/float_ops.hpp"
#include "test_random.hpp"

using lowbit::detail::bits_float;
using lowbit::detail::fmul_rz;

namespace {

// Finite floats of any exponent and sign, subnormals included, with extra weight on
// exact small integers and powers of two (where directed roundings have ties to get
// wrong).
float any_finite(std::mt19937_64& g) {
  const std::uint64_t r = g();
  switch (r % 4) {
    case 0:
      return static_cast<float>(static_cast<int>(r >> 40) % 64 - 32);
    case 1:
      return std::ldexp(1.0f, static_cast<int>(r >> 40) % 200 - 149);
    default: {
      float x;
      do x = bits_float(static_cast<std::uint32_t>(r >> 8) ^ static_cast<std::uint32_t>(g()));
      while (!std::isfinite(x));
      return x;
    }
  }
}

// The next float from f away from zero (inf past FLT_MAX).
float away(float f) { return std::nextafter(f, std::signbit(f) ? -HUGE_VALF : HUGE_VALF); }

}  // namespace

TEST_CASE("fmul_rz is the product rounded towards zero") {
  auto g = lowbit::test::rng(1);
  for (int i = 0; i < 400000; ++i) {
    const float a = any_finite(g), b = any_finite(g);
    const double exact = static_cast<double>(a) * b;
    const float r = fmul_rz(a, b);
    INFO(a << " * " << b << " -> " << r);
    REQUIRE(std::fabs(static_cast<double>(r)) <= std::fabs(exact));
    if (exact != 0.0) {
      REQUIRE(!std::signbit(r) == (exact > 0));
      REQUIRE(std::fabs(static_cast<double>(away(r))) > std::fabs(exact));
    }
  }
  REQUIRE(fmul_rz(FLT_MAX, 2.0f) == FLT_MAX);  // an overflow stops at the largest float
  REQUIRE(std::isinf(fmul_rz(HUGE_VALF, 2.0f)));
  REQUIRE(std::isnan(fmul_rz(HUGE_VALF, 0.0f)));
}
