// One lane's share of encoding: the block statistics (reduced across the block's
// lanes), the metadata, the codes of the lane's group, its packed words and the
// feedback update; the same LOWBIT_HD codec calls, in the same order, as the host.
#pragma once

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cuda_bf16.h>

#include "lowbit/codec/codec.hpp"
#include "lowbit/kernels/detail/frame_io.cuh"
#include "lowbit/kernels/detail/group_decoder.cuh"
#include "lowbit/kernels/detail/lane_layout.cuh"

namespace lowbit::kernels::detail {

template <class P, class = void>
struct has_divide_flag : std::false_type {};
template <class P>
struct has_divide_flag<P, std::void_t<decltype(std::declval<P&>().divide)>> : std::true_type {};

/// Codec::quantize_group for all 32 values. The quantizers keep a run-time `divide`
/// flag (1/step overflows for subnormal steps) that every element tests; calling with
/// a copy whose flag is the constant false lets the compiler drop that path from the
/// common case. The results are the function's own either way.
template <class Codec>
__device__ __forceinline__ void quantize_all(const float (&c)[32],
                                             const typename Codec::params_type& p,
                                             const rng_key& key, std::uint64_t index,
                                             std::uint32_t (&codes)[32]) {
  if constexpr (has_divide_flag<typename Codec::params_type>::value) {
    if (!p.divide) {
      typename Codec::params_type q = p;
      q.divide = false;
      Codec::quantize_group(c, 32, q, key, index, codes);
      return;
    }
  }
  Codec::quantize_group(c, 32, p, key, index, codes);
}

/// quantize_all for a codec with high_codes: Codec::quantize_group_high, the codes left at
/// bits [16, 32) for pack::pack_group_high.
template <class Codec>
__device__ __forceinline__ void quantize_all_high(const float (&c)[32],
                                                  const typename Codec::params_type& p,
                                                  const rng_key& key, std::uint64_t index,
                                                  std::uint32_t (&raw)[32]) {
  if constexpr (has_divide_flag<typename Codec::params_type>::value) {
    if (!p.divide) {
      typename Codec::params_type q = p;
      q.divide = false;
      Codec::quantize_group_high(c, 32, q, key, index, raw);
      return;
    }
  }
  Codec::quantize_group_high(c, 32, p, key, index, raw);
}

/// The block statistics by the host's own code: block_stats::add over the lane's
/// values, then an ordered merge across the block's lanes. Bit for bit the host's left
/// fold, whatever the values; the fast paths below fall back to it.
template <class Layout>
__device__ __forceinline__ quant::block_stats exact_block_statistics(const float (&c)[32],
                                                                     int valid, int lane) {
  quant::block_stats stats;
  LOWBIT_UNROLL
  for (int i = 0; i < 32; ++i)
    if (i < valid) stats.add(c[i]);
  return reduce_block_stats<Layout::lanes_per_block>(stats, lane);
}

/// max(a, b) that returns nan when either is nan (fmaxf returns the other operand).
__device__ __forceinline__ float max_nan(float a, float b) {
#if __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? a + b : fmaxf(a, b);
#endif
}

/// max |x| over a lane's values (0 past `valid`), nan when one is nan.
///
/// Four running maxima, not one: a chain of 32 dependent maxima is 32 latencies long, and at
/// the few warps per scheduler these kernels run nothing else hides them. The NaN-propagating
/// max of non-negative values is associative and commutative, bit for bit (every NaN result
/// is the canonical NaN), so the order is free.
__device__ __forceinline__ float lane_abs_max(const float (&c)[32]) {
  float m[4] = {fabsf(c[0]), fabsf(c[1]), fabsf(c[2]), fabsf(c[3])};
  LOWBIT_UNROLL
  for (int i = 4; i < 32; ++i) m[i % 4] = max_nan(m[i % 4], fabsf(c[i]));
  return max_nan(max_nan(m[0], m[1]), max_nan(m[2], m[3]));
}

/// lane_abs_max of 32 bfloat16 values held two a word (element 2k in the low half, all
/// valid), on the packed pairs: the NaN-propagating max and min of the pairs (the device's
/// three-input bf16x2 min/max takes two words an instruction), then max(max, -min) of the
/// two halves in fp32. Where block_statistics reads it, it is the same: a value is nan
/// exactly when one of the inputs is nan; otherwise it is max |x| as a real number (bfloat16
/// to float is exact and monotone), so the same float when it is positive; +-inf when an
/// input is infinite; and +-0 only for a block of zeros (or of subnormals, should the
/// bf16x2 min/max flush them), which the caller sends to the exact path for any zero.
__device__ __forceinline__ float lane_abs_max_bf16(const std::uint32_t (&w)[16]) {
  auto pair = [&](int i) {
    __nv_bfloat162 h;
    std::memcpy(&h, &w[i], sizeof h);
    return h;
  };
  __nv_bfloat162 hi[2] = {pair(0), pair(1)}, lo[2] = {pair(0), pair(1)};
  LOWBIT_UNROLL
  for (int i = 2; i < 16; ++i) {
    hi[i % 2] = __hmax2_nan(hi[i % 2], pair(i));
    lo[i % 2] = __hmin2_nan(lo[i % 2], pair(i));
  }
  // max(max, -min) pairwise, then of the two halves. The negation flips the sign bits (an
  // arithmetic negation may be a multiply-add that could flush a subnormal), so it is exact
  // and keeps nan a nan.
  const __nv_bfloat162 mn = __hmin2_nan(lo[0], lo[1]);
  std::uint32_t b;
  std::memcpy(&b, &mn, sizeof b);
  b ^= 0x80008000u;
  __nv_bfloat162 neg_mn;
  std::memcpy(&neg_mn, &b, sizeof b);
  const __nv_bfloat162 m = __hmax2_nan(__hmax2_nan(hi[0], hi[1]), neg_mn);
  std::memcpy(&b, &m, sizeof b);
  return max_nan(__uint_as_float(b << 16), __uint_as_float(b & 0xffff0000u));
}

/// Exact statistics of a lane's quantizer block: bit for bit what the host's left fold
/// of block_stats::add over the block computes, as far as the quantizer reads them.
///
/// A symmetric quantizer (quant::is_symmetric_v: it reads only absmax() and poisoned())
/// takes one instruction a value, a NaN-propagating max of |x| (inf and nan both end
/// above every finite value). Others take three: fminf/fmaxf and a NaN sentinel (x * 0
/// is NaN exactly for inf and nan). For a block free of inf/nan whose extremes are
/// nonzero, these are the host's values with the host's bits (equal nonzero floats have
/// equal bits). Otherwise (a poisoned block, or a zero extreme, where the host's +0/-0
/// depends on element order) the warp recomputes with block_stats itself.
///
/// `lane_amax`, where the caller has it, is lane_abs_max(c) or what stands for it
/// (lane_abs_max_bf16); symmetric quantizers only.
template <class Quantizer, class Layout>
__device__ __forceinline__ quant::block_stats block_statistics(const float (&c)[32], int valid,
                                                               int lane,
                                                               const float* lane_amax = nullptr) {
  if constexpr (quant::is_symmetric_v<Quantizer>) {
    // (The values past `valid` are 0 and leave the maximum alone.)
    float amax = lane_amax != nullptr ? *lane_amax : lane_abs_max(c);
    LOWBIT_UNROLL
    for (int d = 1; d < Layout::lanes_per_block; d <<= 1)
      amax = max_nan(amax, __shfl_xor_sync(0xffffffffu, amax, d));
    // False for nan; a lane past the end (valid 0) has no block to get wrong.
    const bool exact = valid == 0 || (amax > 0.0f && amax <= FLT_MAX);
    if (__all_sync(0xffffffffu, exact)) {
      quant::block_stats stats;  // min is not the block's: a symmetric quantizer never reads it
      stats.min = -amax;
      stats.max = amax;
      return stats;
    }
    return exact_block_statistics<Layout>(c, valid, lane);
  } else {
    float mn = FLT_MAX, mx = -FLT_MAX, sentinel = 0.0f;
    if (valid == 32) {
      LOWBIT_UNROLL
      for (int i = 0; i < 32; ++i) {
        mn = fminf(mn, c[i]);
        mx = fmaxf(mx, c[i]);
        sentinel = fmaf(c[i], 0.0f, sentinel);
      }
    } else {
      LOWBIT_UNROLL
      for (int i = 0; i < 32; ++i) {
        if (i < valid) {
          mn = fminf(mn, c[i]);
          mx = fmaxf(mx, c[i]);
          sentinel = fmaf(c[i], 0.0f, sentinel);
        }
      }
    }
    LOWBIT_UNROLL
    for (int d = 1; d < Layout::lanes_per_block; d <<= 1) {
      mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, d));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
      sentinel = sentinel + __shfl_xor_sync(0xffffffffu, sentinel, d);
    }
    const bool exact = !(sentinel != sentinel) && mn != 0.0f && mx != 0.0f;
    if (__all_sync(0xffffffffu, exact)) {
      quant::block_stats stats;
      stats.min = mn;
      stats.max = mx;
      return stats;
    }
    return exact_block_statistics<Layout>(c, valid, lane);
  }
}

/// Clears the bits of codes [valid, 32) in a group's `Bits` packed words.
template <int Bits>
__device__ __forceinline__ void clear_codes_from(std::uint32_t (&w)[Bits], int valid) {
  const int keep = valid * Bits;  // the stream's bits to keep
  LOWBIT_UNROLL
  for (int j = 0; j < Bits; ++j) {
    const int k = keep - 32 * j;  // of this word's
    w[j] = k >= 32 ? w[j] : k <= 0 ? 0u : w[j] & ((1u << k) - 1u);
  }
}

/// Encodes one lane's group. Every lane of the warp calls it (the statistics are
/// reduced with shuffles); lanes with `live` false (idle layout lanes, blocks past the
/// end) contribute nothing and write nothing.
///
/// c      the lane's values (x, or the fp32 sum), valid in [0, valid); the rest are 0
/// fb     the feedback ref, indexed from the group's first value
/// index  tensor index of the group's first value (keys stochastic rounding)
/// decode_back  when true, c leaves holding the decoded codes (Codec::dequantize_group of
///              what was written: the bits kernels::decode of the frame would produce)
/// lane_amax  where not null: lane_abs_max(c) or what stands for it (lane_abs_max_bf16),
///            taken by a symmetric quantizer's statistics; not with active feedback, which
///            changes c first
template <class Codec, class Layout, class Feedback>
__device__ __forceinline__ void encode_group(float (&c)[32], int valid, int lane, bool live,
                                             std::size_t block, std::size_t group, std::byte* frame,
                                             std::size_t codes_offset, const rng_key& key,
                                             std::uint64_t index, const Feedback& fb,
                                             bool decode_back = false,
                                             const float* lane_amax = nullptr) {
  using quantizer = typename Codec::quantizer_type;
  constexpr int G = Codec::group_size;

  if constexpr (Feedback::active) {
    LOWBIT_UNROLL
    for (int i = 0; i < G; ++i)
      if (i < valid) c[i] = fb.load(static_cast<std::size_t>(i), c[i]);
  }

  const quant::block_stats stats =
      block_statistics<quantizer, Layout>(c, valid, lane, Feedback::active ? nullptr : lane_amax);
  const auto meta = quantizer::make_meta(stats);
  const auto params = quantizer::make_params(meta);
  // codes[i] is code i, or with Codec::high_codes (stochastic rounding) code i at bits
  // [16, 32) and bits [0, 16) not the code's: pack_group_high takes the codes from there
  // with byte permutes (bf16 4-bit stochastic encode, the quantize and pack of a tile:
  // see docs/design.md), where moving each to bit 0 and into its place cost a shift, a mask
  // and an add a code.
  std::uint32_t codes[G];
  std::uint32_t words[Codec::bits];
  if constexpr (Codec::high_codes) {
    quantize_all_high<Codec>(c, params, key, index, codes);
    pack::pack_group_high<Codec::bits>(codes, words);
  } else {
    quantize_all<Codec>(c, params, key, index, codes);
    Codec::pack(codes, words);
  }
  // Missing values of a partial block are coded 0: their bits are cleared in the packed
  // words, not in the codes. Zeroing the codes (a select each, on a path the full groups
  // share) made every code a value of its own before the pack; left to the pack alone, a
  // code's offset (a rounding's float bits minus a magic number) folds into one constant a
  // word. The values past `valid` are 0, so their codes are in range and the other words'
  // bits are the zero codes' bits.
  if (valid < G) clear_codes_from<Codec::bits>(words, valid);

  if (live) {
    store_words<Codec::bits>(frame + codes_offset + group * Codec::group_bytes, words);
    if (Layout::group_in_block(lane) == 0) store_meta(frame, block, meta);
  }

  if constexpr (Feedback::active) {
    // A poisoned block leaves the state untouched, as on the host.
    if (!stats.poisoned()) {
      LOWBIT_UNROLL
      for (int i = 0; i < G; ++i)
        if (i < valid)
          fb.store(static_cast<std::size_t>(i), c[i],
                   quantizer::dequantize(Codec::high_codes ? codes[i] >> 16 : codes[i], meta));
    }
  }
  if (decode_back) {
    // From the words just stored (whose codes past `valid` are cleared to 0), not from
    // `codes`: kept for this branch, the codes were each a value of its own before the pack
    // (the offset of every code added one by one, 32 adds a group on every path), and the
    // pack's one-constant-a-word folding was lost. for_each_value is
    // dequantize_group(unpack(words)) bit for bit.
    for_each_value<Codec>(words, meta, [&](int i, float v) { c[i] = v; });
  }
}

}  // namespace lowbit::kernels::detail
