// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11):
// a counter-based generator. The same (key, counter) gives the same 128 bits on the
// host and on the device, with no state to carry between calls, which is what makes
// stochastic rounding reproducible and independent of how work is split into threads.
#pragma once

#include <cstdint>

#include "lowbit/core/config.hpp"

namespace lowbit {

/// Four 32-bit words: a Philox counter or its output.
struct philox_block {
  std::uint32_t w[4];
};

namespace detail {

LOWBIT_HD std::uint32_t mulhi32(std::uint32_t a, std::uint32_t b) {
#if LOWBIT_DEVICE_PASS
  return __umulhi(a, b);
#else
  return static_cast<std::uint32_t>((static_cast<std::uint64_t>(a) * b) >> 32);
#endif
}

}  // namespace detail

/// Philox4x32 with `Rounds` rounds (10 is the published, BigCrush-clean default).
template <int Rounds = 10>
LOWBIT_HD philox_block philox4x32(philox_block ctr, std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  LOWBIT_UNROLL
  for (int r = 0; r < Rounds; ++r) {
    const std::uint32_t hi0 = detail::mulhi32(m0, ctr.w[0]), lo0 = m0 * ctr.w[0];
    const std::uint32_t hi1 = detail::mulhi32(m1, ctr.w[2]), lo1 = m1 * ctr.w[2];
    ctr = philox_block{{hi1 ^ ctr.w[1] ^ k0, lo1, hi0 ^ ctr.w[3] ^ k1, lo0}};
    k0 += w0;
    k1 += w1;
  }
  return ctr;
}

/// What keys one stream of rounding noise: the run's seed, the training step, the
/// encoding rank and the stage (stage 0 quantizes inputs, stage 1 the reduced shard).
/// Element `i` of a tensor draws byte i % 16 of the counter (i / 16, stage, step, rank)'s
/// output, so results do not depend on thread layout, chunking or the backend.
struct rng_key {
  std::uint64_t seed = 0;
  std::uint32_t step = 0;
  std::uint32_t rank = 0;
  std::uint32_t stage = 0;

  /// Elements sharing one Philox call: 128 bits, 8 bits each.
  static constexpr int values_per_draw = 16;

  /// 128 random bits shared by elements [16*j, 16*j + 16).
  LOWBIT_HD philox_block draw(std::uint64_t j) const {
    const philox_block ctr{{static_cast<std::uint32_t>(j),
                            static_cast<std::uint32_t>(j >> 32) ^ (stage << 24), step, rank}};
    return philox4x32(ctr, static_cast<std::uint32_t>(seed),
                      static_cast<std::uint32_t>(seed >> 32));
  }

  /// The rounding noise of element m (0..15) of a draw, as the 16-bit value the rounding
  /// policies take: byte m of the 128 bits (little-endian words) in the high half, and
  /// 0x80, half of the low half's range, below it. Noise u = (n + 1/2) / 2^8 for n uniform
  /// in 0..255: stochastic rounding then rounds up with probability round(2^8 f) / 2^8 for
  /// a position whose fraction above its floor is f (taken in 2^-16 steps, ties down), which
  /// is within 2^-9 of f either way and exact at multiples of 2^-8 (see round::stochastic).
  /// Eight bits a value let one Philox call serve 16 values, half the generator's
  /// instructions of 16-bit draws.
  ///
  /// The device takes the byte with one byte permute (a shift and a mask are two or three
  /// integer instructions a value), and both sides add the 0x80 rather than or it in (the
  /// same value: the low byte is zero), so that the rounding folds it into its constant.
  LOWBIT_HD static std::uint32_t noise16(const philox_block& r, int m) {
#if LOWBIT_DEVICE_PASS
    return __byte_perm(r.w[m / 4], 0u, 0x4404u | (static_cast<unsigned>(m % 4) << 4)) + 0x80u;
#else
    return (((r.w[m / 4] >> (8 * (m % 4))) & 0xffu) << 8) + 0x80u;
#endif
  }
};

}  // namespace lowbit
