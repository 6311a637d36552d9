// A packed group's 32 values in fp32, as Codec::unpack then Codec::dequantize_group compute
// them: for the symmetric full grid, the unpacking and the level's construction fused into
// one logic op a value and a shift for every few values.
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

/// True when for_each_level can run: the full grid, and no code straddles two words.
template <class Codec>
inline constexpr bool fused_levels_v =
    is_full_grid_absmax<typename Codec::quantizer_type>::value && 32 % Codec::bits == 0;

/// (x & Mask) | k as one LOP3. Written in C++, with k a constant, ptxas emits an AND and an
/// OR (a LOP3 takes one immediate); with k in a register (ptxas hoists it out of the loops)
/// it is one instruction, on the integer pipe that bounds the decoding loops.
template <std::uint32_t Mask>
__device__ __forceinline__ std::uint32_t and_or(std::uint32_t x, std::uint32_t k) {
  std::uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(x), "n"(Mask), "r"(k));
  return r;
}

/// Calls f(i, l) for the group's levels in order: l = q + 1/2 of code i on the full grid
/// (absmax::level_at; the value is l * step), bit for bit
/// fsub(bits_float(level_bits | Codec::unpack(w)[i] << 1), level_base).
///
/// A code chunk (absmax::level_chunk_codes) is the word shifted once so that its codes sit
/// where level_at takes them; each code of it is then one LOP3 (the word masked to the
/// code's bits, or-ed with the level constant of its place, held in a register) and one
/// subtraction of its place's base (an immediate). 4 bits: 8 LOP3s and 2 shifts a word,
/// where one shift and one LOP3 a code took 16.
template <class Codec, class F>
__device__ __forceinline__ void for_each_level(const std::uint32_t (&w)[Codec::bits], F&& f) {
  static_assert(fused_levels_v<Codec>, "for_each_level: the full grid, 32 % bits == 0");
  using Q = typename Codec::quantizer_type;
  LOWBIT_UNROLL
  for (int i = 0; i < 32; ++i) {
    const std::uint32_t word = w[i / Q::level_codes_per_word];
    const int j = i % Q::level_codes_per_word;  // the code's place in its word
    const int shift = Q::level_chunk_shift(j);
    const std::uint32_t x = shift == 0 ? word : shift > 0 ? word >> shift : word << -shift;
    // K = level_chunk_place(m), as a constant expression of the unrolled index.
    switch (j % Q::level_chunk_codes) {
#define LOWBIT_LEVEL_CASE(M)                                                                       \
  case M:                                                                                          \
    if constexpr (M < Q::level_chunk_codes) {                                                      \
      constexpr int K = Q::level_chunk_place(M);                                                   \
      f(i, lowbit::detail::fsub(lowbit::detail::bits_float(                                        \
                                    and_or<(Q::code_mask << K)>(x, Q::template level_bits_at<K>)), \
                                Q::template level_base_at<K>));                                    \
    }                                                                                              \
    break;
      LOWBIT_LEVEL_CASE(0)
      LOWBIT_LEVEL_CASE(1)
      LOWBIT_LEVEL_CASE(2)
      LOWBIT_LEVEL_CASE(3)
#undef LOWBIT_LEVEL_CASE
    }
  }
}

/// Calls f(i, v) for the group's values in order, v = Codec::dequantize_group(
/// Codec::unpack(w), m)[i] bit for bit; f consumes each value as it is made, so that a sum
/// needs no second array of 32 (the 64-register decode kernels spilled with one).
/// On the full grid (where no code straddles two words) v = fmul(l, step), l from
/// for_each_level: dequantize's own product of the same exact level.
template <class Codec, class F>
__device__ __forceinline__ void for_each_value(const std::uint32_t (&w)[Codec::bits],
                                               const typename Codec::meta_type& m, F&& f) {
  if constexpr (fused_levels_v<Codec>) {
    const float step = m.step;
    for_each_level<Codec>(w, [&](int i, float l) { f(i, lowbit::detail::fmul(l, step)); });
  } else {
    std::uint32_t codes[32];
    Codec::unpack(w, codes);
    LOWBIT_UNROLL
    for (int i = 0; i < 32; ++i) f(i, Codec::quantizer_type::dequantize(codes[i], m));
  }
}

/// y[i] = fadd(0.0f, value i): the start of a sum of frames (the host's acc = 0, then
/// acc + value). On the full grid, one fused multiply-add with 0 a value where the step
/// allows it (absmax::first_sum_fusable, nearly always), in place of a multiply and an add.
template <class Codec>
__device__ __forceinline__ void start_sum(const std::uint32_t (&w)[Codec::bits],
                                          const typename Codec::meta_type& m, float (&y)[32]) {
  if constexpr (fused_levels_v<Codec>) {
    using Q = typename Codec::quantizer_type;
    const float step = m.step;
    if (Q::first_sum_fusable(step)) {
      for_each_level<Codec>(w, [&](int i, float l) { y[i] = Q::first_sum(l, step); });
      return;
    }
  }
  for_each_value<Codec>(w, m, [&](int i, float v) { y[i] = lowbit::detail::fadd(0.0f, v); });
}

}  // namespace lowbit::kernels::detail
