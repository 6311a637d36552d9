// Rounding policies: how a real-valued position on a quantizer's grid becomes an
// integer. Quantizers call `Rounding::apply(t, noise)` and nothing else, with t already
// clamped to their code range (|t| <= 2^22), and get an integer-valued float back.
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
};

/// Stochastic rounding: up with probability equal to the fractional part, so the
/// expected value is t (unbiased to within 2^-16 of a step: the noise has 16 bits).
/// The noise comes from Philox keyed by (seed, step, rank, element index).
struct stochastic {
  static constexpr bool needs_noise = true;
  static constexpr const char* name = "stochastic";
  LOWBIT_HD static float apply(float t, std::uint32_t noise16) {
    const float base = detail::floor_f(t);
    const float frac = detail::fsub(t, base);  // exact
    // u = noise16 / 2^16 exactly: the noise as the mantissa of a float in [1, 2).
    const float u = detail::fsub(detail::bits_float(0x3f800000u | (noise16 << 7)), 1.0f);
    return u < frac ? detail::fadd(base, 1.0f) : base;
  }
};

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
