// Rounding policies: how a real-valued position on a quantizer's grid becomes an
// integer.
//
// A policy R provides, all LOWBIT_HD and static:
//   float apply(float t, uint32_t noise16);   // t rounded to an integer-valued float,
//                                             // for |t| <= 2^22
//   template <int Lo, int Hi>
//   uint32_t index(float p, float shift, uint32_t noise16);
//                        // p + shift rounded, minus Lo, for p + shift in [Lo, Hi]
// and the constants `needs_noise` and `name`. Quantizers call round::to_grid (which
// clamps p + shift to [Lo, Hi] first) or, where the position is in range by
// construction, round::to_grid_in_range; both use R::index when R has one and build it
// from R::apply otherwise: `index` exists so that a policy can fuse the rounding and the
// conversion to a code into a few instructions of the encode kernel's inner loop.
#pragma once

#include <cstdint>
#include <type_traits>

#include "lowbit/core/config.hpp"
#include "lowbit/core/float_ops.hpp"

namespace lowbit::round {

/// Round to the nearest integer, ties to even: deterministic, error <= half a step.
struct nearest {
  static constexpr bool needs_noise = false;
  static constexpr const char* name = "nearest";
  LOWBIT_HD static float apply(float t, std::uint32_t /*noise16*/) { return detail::rint_even(t); }

  /// fadd(p, shift) (in [Lo, Hi]) rounded to nearest even, minus Lo. The sum with
  /// round_magic that rounds t already holds the integer in its low bits: reading them
  /// there saves rint_even's subtraction and int_of's second addition.
  template <int Lo, int Hi>
  LOWBIT_HD static std::uint32_t index(float p, float shift, std::uint32_t /*noise16*/) {
    static_assert(-(1 << 22) <= Lo && Lo < Hi && Hi <= (1 << 22),
                  "lowbit::round::nearest: the grid must lie in [-2^22, 2^22]");
    const float t = shift != 0.0f ? detail::fadd(p, shift) : p;
    return detail::float_bits(detail::fadd(t, detail::round_magic)) -
           (detail::round_magic_bits + static_cast<std::uint32_t>(Lo));
  }
};

/// Stochastic rounding with 16 bits of noise: t is first rounded up to a multiple of
/// 2^-16, c = ceil(2^16 t); the result is floor(c / 2^16), plus one when the noise is
/// below the 16-bit fraction c mod 2^16. The expected value is c / 2^16, within 2^-16 of
/// a step above t; integers never move. The noise comes from Philox keyed by (seed,
/// step, rank, element index).
///
/// The codec draws 8 random bits a value (rng_key::noise16: noise16 = 256 n + 128, n
/// uniform in 0..255), so that one Philox call serves 16 values. With that noise the
/// round-up probability is round(2^8 f) / 2^8 (f = (c mod 2^16) / 2^16, ties down): the
/// expected value is within 2^-9 of a step of c / 2^16, above or below it by the
/// position's place inside its 2^-8-wide cell, so the error averages out over positions
/// spread across a cell instead of always leaning up, as a draw of fewer bits taken as
/// the top of a 16-bit noise (n * 256) would (bias up to 2^-8, always upward). The
/// variance grows by at most 2^-18 of a step squared. Against the up to 1/4 step squared
/// that stochastic rounding itself adds, and an fp32 or bf16 input whose own spacing at
/// the grid's ends is 2^-7 to 2^-16 of a step, 8 bits are the resolution the
/// quantizers need; the function below takes any 16-bit noise.
struct stochastic {
  static constexpr bool needs_noise = true;
  static constexpr const char* name = "stochastic";

  LOWBIT_HD static float apply(float t, std::uint32_t noise16) {
    // 2^16 t is exact (a power-of-two scaling), and so is its ceiling.
    const auto c = static_cast<std::int64_t>(detail::ceil_f(detail::fmul(t, 65536.0f)));
    const std::int64_t up = static_cast<std::int64_t>(noise16) < (c & 0xffff) ? 1 : 0;
    return static_cast<float>((c >> 16) + up);  // >> floors: c is two's complement
  }

  /// p + shift (shift a multiple of 1/2, |shift| <= 1; the sum taken exactly, in
  /// [Lo, Hi]) rounded as `apply` rounds, minus Lo.
  template <int Lo, int Hi>
  LOWBIT_HD static std::uint32_t index(float t, float shift, std::uint32_t noise16) {
    static_assert(-(1 << 15) <= Lo && Lo < Hi && Hi <= (1 << 16),
                  "lowbit::round::stochastic: the grid must lie in [-2^15, 2^16]");
#if LOWBIT_DEVICE_PASS
    if constexpr (Hi - Lo <= 128) {
      return index_small<Lo>(t, shift, noise16);
    } else if constexpr (-(1 << 14) < Lo && Hi < (1 << 14)) {
      // |2^16 t| < 2^31, exact: one conversion rounding up gives ceil(2^16 t) as an int;
      // c, modulo 2^32, is then below 2^31.
      const auto offset = static_cast<std::uint32_t>(
          static_cast<std::int64_t>(detail::fmul(shift, 65536.0f)) - std::int64_t{Lo} * 65536);
      const auto c = static_cast<std::uint32_t>(__float2int_ru(detail::fmul(t, 65536.0f))) + offset;
      return (c + (0xffffu - noise16)) >> 16;
    }
#endif
    // c = ceil(2^16 (t + shift - Lo)) >= 0; the carry of c + (2^16 - 1 - noise) into
    // bit 16 is the round-up.
    const std::int64_t c = static_cast<std::int64_t>(detail::ceil_f(detail::fmul(t, 65536.0f))) +
                           static_cast<std::int64_t>(
                               detail::fmul(detail::fsub(shift, static_cast<float>(Lo)), 65536.0f));
    return static_cast<std::uint32_t>((c + 0xffff - static_cast<std::int64_t>(noise16)) >> 16);
  }

  /// `index` for a grid of at most 128 steps: one upward-rounded add, one three-input
  /// integer add and a shift. Floats in [128, 256] are exactly the multiples of 2^-16, so adding
  /// 128 + shift - Lo rounding upwards gives 128 + c / 2^16, and the float's bits minus
  /// 128's are c. The encode kernel runs this; the tests check it against the exact path.
  template <int Lo>
  LOWBIT_HD static std::uint32_t index_small(float t, float shift, std::uint32_t noise16) {
    return index_small_high<Lo>(t, shift, noise16) >> 16;
  }
  /// index_small before its shift: the index at bits [16, 32), bits [0, 16) not the index's.
  template <int Lo>
  LOWBIT_HD static std::uint32_t index_small_high(float t, float shift, std::uint32_t noise16) {
    constexpr float base = 128.0f;
    constexpr std::uint32_t base_bits = 0x43000000u;
    const float s = detail::fadd_ru(t, detail::fsub(base + shift, static_cast<float>(Lo)));
    return detail::float_bits(s) - base_bits + (0xffffu - noise16);
  }

  /// `index` left where the rounding's carry puts it, for a grid of fewer than 2^16 steps:
  /// the index at bits [16, 32), bits [0, 16) not the index's (index_high >> 16 ==
  /// index). A packer can take the index from there (pack::pack_group_high) without the
  /// shift and the mask a value that moving it to bit 0 and then into its place cost.
  template <int Lo, int Hi>
  LOWBIT_HD static std::uint32_t index_high(float t, float shift, std::uint32_t noise16) {
    static_assert(-(1 << 15) <= Lo && Lo < Hi && Hi - Lo < (1 << 16),
                  "lowbit::round::stochastic::index_high: the grid must lie in [-2^15, 2^16] "
                  "and have fewer than 2^16 steps");
#if LOWBIT_DEVICE_PASS
    if constexpr (Hi - Lo <= 128) {
      return index_small_high<Lo>(t, shift, noise16);
    } else if constexpr (-(1 << 14) < Lo && Hi < (1 << 14)) {
      const auto offset = static_cast<std::uint32_t>(
          static_cast<std::int64_t>(detail::fmul(shift, 65536.0f)) - std::int64_t{Lo} * 65536);
      const auto c = static_cast<std::uint32_t>(__float2int_ru(detail::fmul(t, 65536.0f))) + offset;
      return c + (0xffffu - noise16);
    }
#endif
    // As in index: c + 2^16 - 1 - noise is below 2^16 (Hi - Lo + 1) <= 2^32.
    const std::int64_t c = static_cast<std::int64_t>(detail::ceil_f(detail::fmul(t, 65536.0f))) +
                           static_cast<std::int64_t>(
                               detail::fmul(detail::fsub(shift, static_cast<float>(Lo)), 65536.0f));
    return static_cast<std::uint32_t>(c + 0xffff - static_cast<std::int64_t>(noise16));
  }
};

namespace detail {
template <class R, class = void>
struct has_index : std::false_type {};
template <class R>
struct has_index<R, std::void_t<decltype(R::template index<0, 1>(0.0f, 0.0f, 0u))>>
    : std::true_type {};
}  // namespace detail

/// The code of position p on the integer grid [Lo, Hi] when p + shift is known to lie in
/// [Lo, Hi] (a quantizer whose scaling bounds it): p + shift rounded by R, minus Lo (so
/// in [0, Hi - Lo]).
template <class R, int Lo, int Hi>
LOWBIT_HD std::uint32_t to_grid_in_range(float p, float shift, std::uint32_t noise16) {
  if constexpr (detail::has_index<R>::value) {
    return R::template index<Lo, Hi>(p, shift, noise16);
  } else {  // a user policy with `apply` alone
    const float t = shift != 0.0f ? lowbit::detail::fadd(p, shift) : p;
    return static_cast<std::uint32_t>(lowbit::detail::int_of(R::apply(t, noise16)) - Lo);
  }
}

/// The code of any position p on the integer grid [Lo, Hi]: p + shift clamped to
/// [Lo, Hi] (nan to Lo), rounded by R, minus Lo. What the integer quantizers call.
/// Clamping p to [Lo - shift, Hi - shift] first is the same clamp (shift is a multiple of
/// 1/2, so both bounds are exact).
template <class R, int Lo, int Hi>
LOWBIT_HD std::uint32_t to_grid(float p, float shift, std::uint32_t noise16) {
  const float t =
      lowbit::detail::clamp_f(p, static_cast<float>(Lo) - shift, static_cast<float>(Hi) - shift);
  return to_grid_in_range<R, Lo, Hi>(t, shift, noise16);
}

template <class R, class = void>
struct has_index_high : std::false_type {};
template <class R>
struct has_index_high<R, std::void_t<decltype(R::template index_high<0, 1>(0.0f, 0.0f, 0u))>>
    : std::true_type {};
template <class R>
inline constexpr bool has_index_high_v = has_index_high<R>::value;

/// to_grid_in_range and to_grid for a policy with `index_high` (stochastic): the code at
/// bits [16, 32), bits [0, 16) not the code's; `>> 16` gives to_grid_in_range's and
/// to_grid's code.
template <class R, int Lo, int Hi>
LOWBIT_HD std::uint32_t to_grid_in_range_high(float p, float shift, std::uint32_t noise16) {
  return R::template index_high<Lo, Hi>(p, shift, noise16);
}
template <class R, int Lo, int Hi>
LOWBIT_HD std::uint32_t to_grid_high(float p, float shift, std::uint32_t noise16) {
  const float t =
      lowbit::detail::clamp_f(p, static_cast<float>(Lo) - shift, static_cast<float>(Hi) - shift);
  return to_grid_in_range_high<R, Lo, Hi>(t, shift, noise16);
}

/// True for lowbit's rounding policies (a user policy specialises this).
template <class R>
struct is_rounding : std::false_type {};
template <>
struct is_rounding<nearest> : std::true_type {};
template <>
struct is_rounding<stochastic> : std::true_type {};
template <class R>
inline constexpr bool is_rounding_v = is_rounding<R>::value;

}  // namespace lowbit::round
