// Float arithmetic that gives the same bits on the host and on the device.
//
// nvcc contracts `a * b + c` into one FMA and g++ does too when the target has FMA
// instructions (-march=native); one rounding instead of two changes the result. The
// codec must produce identical bytes on both sides, so every rounding step it relies
// on goes through these helpers: `__fmul_rn` and friends on the device (never
// contracted), and on the host an empty asm that pins the intermediate in a register,
// which stops the compiler from fusing it into the next operation at no run-time cost.
#pragma once

#include <cstdint>
#include <cstring>

#include "lowbit/core/config.hpp"

#if !LOWBIT_DEVICE_PASS
#include <cmath>
#endif

namespace lowbit::detail {

/// The bits of a float, and back; works in constexpr-free host and device code.
LOWBIT_HD std::uint32_t float_bits(float x) {
#if LOWBIT_DEVICE_PASS
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

LOWBIT_HD float bits_float(std::uint32_t u) {
#if LOWBIT_DEVICE_PASS
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

/// Stops the host compiler from fusing `x` into a later operation.
LOWBIT_HD float pin(float x) {
#if !LOWBIT_DEVICE_PASS
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm("" : "+x"(x));
#elif defined(__GNUC__) && defined(__aarch64__)
  asm("" : "+w"(x));
#else
  volatile float v = x;
  x = v;
#endif
#endif
  return x;
}

/// a * b rounded to nearest even, never fused with a neighbouring add.
LOWBIT_HD float fmul(float a, float b) {
#if LOWBIT_DEVICE_PASS
  return __fmul_rn(a, b);
#else
  return pin(a * b);
#endif
}

/// a + b rounded to nearest even, never fused with a neighbouring multiply.
LOWBIT_HD float fadd(float a, float b) {
#if LOWBIT_DEVICE_PASS
  return __fadd_rn(a, b);
#else
  return pin(a + b);
#endif
}

/// a - b rounded to nearest even.
LOWBIT_HD float fsub(float a, float b) {
#if LOWBIT_DEVICE_PASS
  return __fsub_rn(a, b);
#else
  return pin(a - b);
#endif
}

/// IEEE a / b (correctly rounded even under --use_fast_math).
LOWBIT_HD float fdiv(float a, float b) {
#if LOWBIT_DEVICE_PASS
  return __fdiv_rn(a, b);
#else
  return pin(a / b);
#endif
}

/// a * b + c rounded once, to nearest even: `__fmaf_rn` on the device, std::fma on the
/// host (exact on every IEEE host: one instruction where the target has FMA, a libm call
/// otherwise). The same bits on both sides, and a * b may exceed FLT_MAX when the sum
/// does not.
LOWBIT_HD float ffma(float a, float b, float c) {
#if LOWBIT_DEVICE_PASS
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

/// The float just below a positive x (FLT_MAX for +inf), by its bits.
LOWBIT_HD float float_below(float x) { return bits_float(float_bits(x) - 1u); }

/// The float just above a non-negative finite x (+inf for FLT_MAX), by its bits.
LOWBIT_HD float float_above(float x) { return bits_float(float_bits(x) + 1u); }

/// 1.5 * 2^23. For |t| <= 2^22, t + round_magic lands in [2^23, 2^24), where floats are
/// exactly the integers: the addition itself rounds t to an integer, which then sits in
/// the low mantissa bits. This does in the FP32 pipe what a conversion instruction
/// would do in the (quarter-rate) conversion pipe, and gives the same bits on the host.
inline constexpr float round_magic = 12582912.0f;
inline constexpr std::uint32_t round_magic_bits = 0x4b400000u;

/// a + b rounded towards +infinity. The host has no per-instruction rounding mode:
/// it takes the round-to-nearest sum and its exact error (Knuth's TwoSum, exact for
/// finite sums without overflow) and steps one float up when the error is positive.
LOWBIT_HD float fadd_ru(float a, float b) {
#if LOWBIT_DEVICE_PASS
  return __fadd_ru(a, b);
#else
  const float s = pin(a + b);
  const float bv = pin(s - a);
  const float av = pin(s - bv);
  const float err = pin(pin(a - av) + pin(b - bv));
  return err > 0.0f ? std::nextafter(s, HUGE_VALF) : s;
#endif
}

/// a * b rounded towards zero (|result| <= |a * b|). The host takes the product in a
/// double, where it is exact, and steps the nearest float back towards zero when it
/// went past.
LOWBIT_HD float fmul_rz(float a, float b) {
#if LOWBIT_DEVICE_PASS
  return __fmul_rz(a, b);
#else
  const double d = static_cast<double>(a) * static_cast<double>(b);
  const float f = static_cast<float>(d);
  return std::fabs(static_cast<double>(f)) > std::fabs(d) ? std::nextafter(f, 0.0f) : f;
#endif
}

/// The smallest integer-valued float >= x (exact).
LOWBIT_HD float ceil_f(float x) {
#if LOWBIT_DEVICE_PASS
  return ceilf(x);
#else
  return std::ceil(x);
#endif
}

/// Round to the nearest integer, ties to even, for |x| <= 2^22 (the float result).
LOWBIT_HD float rint_even(float x) { return fsub(fadd(x, round_magic), round_magic); }

/// Round towards minus infinity, for |x| <= 2^22.
LOWBIT_HD float floor_f(float x) {
#if LOWBIT_DEVICE_PASS
  return __fsub_rn(__fadd_rd(x, round_magic), round_magic);  // add rounding down = floor
#else
  return std::floor(x);
#endif
}

/// The int value of an integer-valued float q, |q| <= 2^22, without a conversion.
LOWBIT_HD int int_of(float q) {
  return static_cast<int>(float_bits(fadd(q, round_magic)) - round_magic_bits);
}

/// The float value of an int q, |q| <= 2^22, without a conversion (exact).
LOWBIT_HD float float_of(int q) {
  return fsub(bits_float(round_magic_bits + static_cast<std::uint32_t>(q)), round_magic);
}

/// |x| by clearing the sign bit.
LOWBIT_HD float abs_f(float x) { return bits_float(float_bits(x) & 0x7fffffffu); }

/// True for inf and nan.
LOWBIT_HD bool is_nonfinite(float x) { return (float_bits(x) & 0x7f800000u) == 0x7f800000u; }

/// max that is exact and order-independent for finite inputs.
LOWBIT_HD float max_f(float a, float b) { return a < b ? b : a; }
LOWBIT_HD float min_f(float a, float b) { return b < a ? b : a; }

/// x clamped to [lo, hi]; nan goes to lo. The sign of a zero result is unspecified
/// (callers round the result, which erases it).
LOWBIT_HD float clamp_f(float x, float lo, float hi) {
#if LOWBIT_DEVICE_PASS
  return fminf(fmaxf(x, lo), hi);  // fmaxf(nan, lo) = lo
#else
  return x > lo ? (x < hi ? x : hi) : lo;
#endif
}

/// 2^e for e in [-126, 127].
LOWBIT_HD float pow2(int e) { return bits_float(static_cast<std::uint32_t>(e + 127) << 23); }

/// A quiet NaN with the canonical payload.
LOWBIT_HD float quiet_nan() { return bits_float(0x7fffffffu); }

}  // namespace lowbit::detail
