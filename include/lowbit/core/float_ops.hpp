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

/// Round to the nearest integer, ties to even (the float result).
LOWBIT_HD float rint_even(float x) {
#if LOWBIT_DEVICE_PASS
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}

/// Round towards minus infinity.
LOWBIT_HD float floor_f(float x) {
#if LOWBIT_DEVICE_PASS
  return floorf(x);
#else
  return std::floor(x);
#endif
}

/// |x| by clearing the sign bit.
LOWBIT_HD float abs_f(float x) { return bits_float(float_bits(x) & 0x7fffffffu); }

/// True for inf and nan.
LOWBIT_HD bool is_nonfinite(float x) { return (float_bits(x) & 0x7f800000u) == 0x7f800000u; }

/// max that is exact and order-independent for finite inputs.
LOWBIT_HD float max_f(float a, float b) { return a < b ? b : a; }
LOWBIT_HD float min_f(float a, float b) { return b < a ? b : a; }

/// x clamped to [lo, hi]; nan goes to lo, so a float-to-int cast after it is defined.
LOWBIT_HD float clamp_f(float x, float lo, float hi) { return x > lo ? (x < hi ? x : hi) : lo; }

/// 2^e for e in [-126, 127].
LOWBIT_HD float pow2(int e) { return bits_float(static_cast<std::uint32_t>(e + 127) << 23); }

/// A quiet NaN with the canonical payload.
LOWBIT_HD float quiet_nan() { return bits_float(0x7fffffffu); }

}  // namespace lowbit::detail
