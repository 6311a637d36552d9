// Element types as raw bits, for moving them through registers and shared memory in
// 16-byte vectors without conversion.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace lowbit::kernels::detail {

/// Packs and unpacks elements of T into 32-bit words (one float, or two 16-bit values,
/// element 2k in the low half: the little-endian memory order).
template <class T>
struct raw_bits;

template <>
struct raw_bits<float> {
  static constexpr int per_word = 1;
  __device__ __forceinline__ static float get(const std::uint32_t* w, int i) {
    return __uint_as_float(w[i]);
  }
  __device__ __forceinline__ static void set(std::uint32_t* w, int i, float x) {
    w[i] = __float_as_uint(x);
  }
};

template <class T>
struct raw_bits16 {
  static constexpr int per_word = 2;
  __device__ __forceinline__ static std::uint16_t half_word(const std::uint32_t* w, int i) {
    return static_cast<std::uint16_t>(w[i / 2] >> (16 * (i % 2)));
  }
  __device__ __forceinline__ static void set_bits(std::uint32_t* w, int i, std::uint16_t b) {
    if (i % 2 == 0) {
      w[i / 2] = b;
    } else {
      w[i / 2] |= static_cast<std::uint32_t>(b) << 16;
    }
  }
};

template <>
struct raw_bits<__half> : raw_bits16<__half> {
  __device__ __forceinline__ static __half get(const std::uint32_t* w, int i) {
    return __ushort_as_half(half_word(w, i));
  }
  /// Sets element i; elements must be set in increasing order (2k before 2k+1).
  __device__ __forceinline__ static void set(std::uint32_t* w, int i, __half x) {
    set_bits(w, i, __half_as_ushort(x));
  }
};

template <>
struct raw_bits<__nv_bfloat16> : raw_bits16<__nv_bfloat16> {
  __device__ __forceinline__ static __nv_bfloat16 get(const std::uint32_t* w, int i) {
    return __ushort_as_bfloat16(half_word(w, i));
  }
  __device__ __forceinline__ static void set(std::uint32_t* w, int i, __nv_bfloat16 x) {
    set_bits(w, i, __bfloat16_as_ushort(x));
  }
};

}  // namespace lowbit::kernels::detail
