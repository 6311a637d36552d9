// A packed group's 32 values in fp32, as Codec::unpack then Codec::dequantize_group compute
// them: for the symmetric full grid, the unpacking and the level's construction fused into
// one shift and one logic op a value.
#pragma once

#include <cstdint>
#include <type_traits>

#include "lowbit/codec/absmax.hpp"
#include "lowbit/codec/codec.hpp"
#include "lowbit/core/float_ops.hpp"

namespace lowbit::kernels::detail {

template <class Q>
struct is_full_grid_absmax : std::false_type {};
template <int Bits, int Block, class Grid>
struct is_full_grid_absmax<quant::absmax<Bits, Block, Grid>>
    : std::bool_constant<!quant::absmax<Bits, Block, Grid>::zero_grid> {};

/// (x & Mask) | k as one LOP3. Written in C++, with k a constant, ptxas emits an AND and an
/// OR (a LOP3 takes one immediate); with k in a register (ptxas hoists it out of the loops)
/// it is one instruction, on the integer pipe that bounds the decoding loops.
template <std::uint32_t Mask>
__device__ __forceinline__ std::uint32_t and_or(std::uint32_t x, std::uint32_t k) {
  std::uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(x), "n"(Mask), "r"(k));
  return r;
}

/// Calls f(i, v) for the group's values in order, v = Codec::dequantize_group(
/// Codec::unpack(w), m)[i] bit for bit; f consumes each value as it is made, so that a sum
/// needs no second array of 32 (the 64-register decode kernels spilled with one).
///
/// On the full grid a code c becomes the float with bits level_bits | c << 1 (absmax.hpp).
/// Where no code straddles two words (32 % bits == 0), that is word >> (s - 1) (word << 1
/// for s = 0) masked to the code's bits, moved up one place, and or-ed with level_bits: the
/// bit that lands below the mask is dropped by it. Then the same subtraction and product.
template <class Codec, class F>
__device__ __forceinline__ void for_each_value(const std::uint32_t (&w)[Codec::bits],
                                               const typename Codec::meta_type& m, F&& f) {
  using Q = typename Codec::quantizer_type;
  constexpr int B = Codec::bits;
  if constexpr (is_full_grid_absmax<Q>::value && 32 % B == 0) {
    constexpr std::uint32_t mask = ((1u << B) - 1u) << 1;
    constexpr int per_word = 32 / B;
    LOWBIT_UNROLL
    for (int i = 0; i < 32; ++i) {
      const std::uint32_t word = w[i / per_word];
      const int s = B * (i % per_word);
      const std::uint32_t x = s == 0 ? word << 1 : word >> (s - 1);
      const float level = lowbit::detail::bits_float(and_or<mask>(x, Q::level_bits));
      f(i, lowbit::detail::fmul(lowbit::detail::fsub(level, Q::level_base), m.step));
    }
  } else {
    std::uint32_t codes[32];
    Codec::unpack(w, codes);
    LOWBIT_UNROLL
    for (int i = 0; i < 32; ++i) f(i, Codec::quantizer_type::dequantize(codes[i], m));
  }
}

}  // namespace lowbit::kernels::detail
