// Element types lowbit reduces: float, __half and __nv_bfloat16, with conversions to
// and from float that give the same bits on the host and on the device.
#pragma once

#include <cstdint>
#include <type_traits>

#include "lowbit/core/config.hpp"
#include "lowbit/core/float_ops.hpp"

#if LOWBIT_HAS_CUDA_HALF
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace lowbit {

/// Element traits: `supported` says whether lowbit can reduce T; `name` prints it.
/// Conversions are round-to-nearest-even; NaN becomes the canonical quiet NaN.
template <class T>
struct numeric_traits {
  static constexpr bool supported = false;
};

template <>
struct numeric_traits<float> {
  static constexpr bool supported = true;
  static constexpr const char* name = "float";
  LOWBIT_HD static float to_float(float x) { return x; }
  LOWBIT_HD static float from_float(float x) { return x; }
};

namespace detail {

/// float -> IEEE binary16 bits, round to nearest even (what cvt.rn.f16.f32 does).
LOWBIT_HD std::uint16_t float_to_half_bits(float x) {
  const std::uint32_t f = float_bits(x);
  const std::uint32_t sign = (f >> 16) & 0x8000u;
  const std::uint32_t a = f & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fffu;                                      // nan
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (a < 0x38800000u) {  // below 2^-14: subnormal
    const std::uint32_t e = a >> 23;
    if (e < 102) return static_cast<std::uint16_t>(sign);
    const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t s = 126 - e;
    std::uint32_t k = m >> s;
    const std::uint32_t rem = m & ((1u << s) - 1);
    const std::uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (k & 1u))) ++k;
    return static_cast<std::uint16_t>(sign | k);
  }
  const std::uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((r - (112u << 23)) >> 13));
}

/// IEEE binary16 bits -> float (exact).
LOWBIT_HD float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  const std::uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return bits_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in float
    const float v = static_cast<float>(m) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

/// float -> bfloat16 bits, round to nearest even (what cvt.rn.bf16.f32 does).
LOWBIT_HD std::uint16_t float_to_bf16_bits(float x) {
  const std::uint32_t f = float_bits(x);
  if ((f & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  return static_cast<std::uint16_t>((f + 0x7fffu + ((f >> 16) & 1u)) >> 16);
}

LOWBIT_HD float bf16_bits_to_float(std::uint16_t b) {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace detail

#if LOWBIT_HAS_CUDA_HALF
template <>
struct numeric_traits<__half> {
  static constexpr bool supported = true;
  static constexpr const char* name = "half";
  LOWBIT_HD static float to_float(__half x) {
#if LOWBIT_DEVICE_PASS
    return __half2float(x);
#else
    return detail::half_bits_to_float(static_cast<__half_raw>(x).x);
#endif
  }
  LOWBIT_HD static __half from_float(float x) {
#if LOWBIT_DEVICE_PASS
    if (detail::is_nonfinite(x) && x != x) return __half(__half_raw{0x7fffu});
    return __float2half_rn(x);
#else
    __half_raw r;
    r.x = detail::float_to_half_bits(x);
    return __half(r);
#endif
  }
};

template <>
struct numeric_traits<__nv_bfloat16> {
  static constexpr bool supported = true;
  static constexpr const char* name = "bfloat16";
  LOWBIT_HD static float to_float(__nv_bfloat16 x) {
    return detail::bf16_bits_to_float(static_cast<__nv_bfloat16_raw>(x).x);
  }
  LOWBIT_HD static __nv_bfloat16 from_float(float x) {
#if LOWBIT_DEVICE_PASS
    if (x != x) return __nv_bfloat16(__nv_bfloat16_raw{0x7fffu});
    return __float2bfloat16_rn(x);
#else
    __nv_bfloat16_raw r;
    r.x = detail::float_to_bf16_bits(x);
    return __nv_bfloat16(r);
#endif
  }
};
#endif

/// True for the element types lowbit reduces.
template <class T>
inline constexpr bool is_element_type_v = numeric_traits<std::remove_cv_t<T>>::supported;

/// T -> float, exact.
template <class T>
LOWBIT_HD float to_float(T x) {
  return numeric_traits<T>::to_float(x);
}

/// float -> T, round to nearest even.
template <class T>
LOWBIT_HD T from_float(float x) {
  return numeric_traits<T>::from_float(x);
}

}  // namespace lowbit
