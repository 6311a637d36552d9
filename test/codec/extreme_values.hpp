// Finite blocks that reach the ends of the float range, for the "finite in, finite out"
// tests of every quantizer: exact +-FLT_MAX elements, ranges above FLT_MAX (min near
// -FLT_MAX, max near +FLT_MAX), tiny and subnormal values beside huge ones, random
// exponents, absmax a few floats below FLT_MAX. Shared by the host test
// (extreme_values_test.cpp) and the device test (test/kernels/extreme_values_test.cu).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "lowbit/core/float_ops.hpp"
#include "test_random.hpp"

namespace lowbit::test {

/// The values of every block below (a multiple of 32: the extreme_blocks are whole
/// blocks of any quantizer of block size 32, 64 or 128).
inline constexpr std::size_t extreme_block_size = 128;

/// A random finite float of any exponent and sign (uniform over the bit patterns).
inline float random_finite(std::mt19937_64& g) {
  for (;;) {
    const float v = detail::bits_float(static_cast<std::uint32_t>(g()));
    if (std::isfinite(v)) return v;
  }
}

/// Ten hand-made blocks followed by `random_blocks` random ones, each of
/// extreme_block_size finite values.
inline std::vector<float> extreme_blocks(std::uint64_t salt, int random_blocks) {
  auto g = rng(salt);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_real_distribution<float> pos(0.0f, 1.0f);
  constexpr std::size_t B = extreme_block_size;
  const float below_max = std::nextafter(FLT_MAX, 0.0f);
  std::vector<float> x;
  auto block = [&](auto value_of) {
    for (std::size_t i = 0; i < B; ++i) x.push_back(value_of(i));
  };

  // Exact +-FLT_MAX only.
  block([&](std::size_t i) { return i % 2 ? -FLT_MAX : FLT_MAX; });
  // +-FLT_MAX with everything in between: max - min = 2 FLT_MAX.
  block([&](std::size_t i) { return i == 0 ? FLT_MAX : i == 1 ? -FLT_MAX : FLT_MAX * unit(g); });
  // One-sided, up to FLT_MAX and down to -FLT_MAX, with zeros of both signs.
  block([&](std::size_t i) { return i == 5 ? FLT_MAX : i % 9 == 0 ? 0.0f : FLT_MAX * pos(g); });
  block([&](std::size_t i) { return i == 7 ? -FLT_MAX : i % 9 == 0 ? -0.0f : -FLT_MAX * pos(g); });
  // Tiny, subnormal and zero values beside +-FLT_MAX.
  block([&](std::size_t i) {
    const float tiny[] = {1e-40f, -1e-45f, 1e-30f, 0.0f, -0.0f, FLT_MIN, 1.0f, -3.0f};
    return i == 3 ? FLT_MAX : i == 60 ? -FLT_MAX : tiny[i % 8];
  });
  // A range just above FLT_MAX: -FLT_MAX with small positives, FLT_MAX with small negatives.
  block([&](std::size_t i) { return i == 0 ? -FLT_MAX : 1e-3f * pos(g); });
  block([&](std::size_t i) { return i == 0 ? FLT_MAX : -1e30f * pos(g); });
  // Random exponents around +-FLT_MAX.
  block([&](std::size_t i) { return i == 11 ? FLT_MAX : i == 12 ? -FLT_MAX : random_finite(g); });
  // A narrow range at the top: min and max both near FLT_MAX.
  block([&](std::size_t i) { return i == 1 ? FLT_MAX : FLT_MAX * (1.0f - 0x1p-10f * pos(g)); });
  block([&](std::size_t i) { return i == 2 ? below_max : -FLT_MAX * (1.0f - 0x1p-20f * pos(g)); });

  // Random blocks: an absmax at or a few floats below FLT_MAX (or anywhere above 2^100),
  // each value drawn from a mix of the block's extremes, scaled uniforms, random
  // exponents, zeros and tiny values; one-sided or both-sided.
  for (int b = 0; b < random_blocks; ++b) {
    float amax;
    switch (g() % 4) {
      case 0:
        amax = FLT_MAX;
        break;
      case 1:
        amax = detail::bits_float(detail::float_bits(FLT_MAX) -
                                  static_cast<std::uint32_t>(g() % 4096));
        break;
      case 2:
        amax = std::ldexp(1.0f + pos(g), 100 + static_cast<int>(g() % 28));
        break;
      default:
        amax = FLT_MAX * (0.5f + 0.5f * pos(g));
        break;
    }
    const int sided = static_cast<int>(g() % 3);  // 0: both signs, 1: >= 0, 2: <= 0
    const float sign = sided == 2 ? -1.0f : 1.0f;
    const std::size_t hi = g() % B, lo = g() % B;
    block([&](std::size_t i) {
      float v;
      switch (g() % 6) {
        case 0:
          v = amax * pos(g);
          break;
        case 1:
          v = random_finite(g);
          if (std::fabs(v) > amax) v = amax;
          break;
        case 2:
          v = 1e-38f * unit(g);
          break;
        case 3:
          v = amax;
          break;
        default:
          v = amax * unit(g);
          break;
      }
      if (sided == 0) {
        if (i == hi) v = amax;
        if (i == lo) v = -amax;
        if (g() % 2) v = -v;
        return v;
      }
      if (i == hi) v = amax;
      return sign * std::fabs(v);
    });
  }
  return x;
}

/// x with one element of every third block replaced by inf, -inf or nan in turn.
inline std::vector<float> poison_every_third(std::vector<float> x) {
  const float bad[] = {HUGE_VALF, -HUGE_VALF, std::nanf("")};
  for (std::size_t b = 0, k = 0; b * extreme_block_size < x.size(); b += 3, ++k)
    x[b * extreme_block_size + (k * 37) % extreme_block_size] = bad[k % 3];
  return x;
}

}  // namespace lowbit::test
