// Symmetric absmax integer quantizer: one fp32 step per block, b-bit codes.
#pragma once

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "lowbit/codec/block_stats.hpp"
#include "lowbit/codec/rounding.hpp"
#include "lowbit/core/config.hpp"
#include "lowbit/core/float_ops.hpp"

namespace lowbit::quant {

/// Where a symmetric grid puts its 2^b levels.
namespace grid {
/// All 2^b levels, (q + 1/2) * step for q in [-2^(b-1), 2^(b-1)), with
/// step = absmax / (2^(b-1) - 1/2) so that the outermost levels are exactly +-absmax:
/// every input lies inside the grid, which keeps stochastic rounding unbiased up to the
/// block's extreme values (a grid whose end levels fall short of absmax must clamp
/// there, and bias). One more level than `zero` (at 2 bits the step shrinks by a
/// third); 1 bit is the scaled sign, +-absmax. Zero is not a level: nearest rounding
/// sends an exact 0 to +step/2 (ties to even), stochastic rounding to +-step/2 with
/// equal odds.
struct full {
  static constexpr const char* name = "full";
};
/// 2^b - 1 levels q * step for |q| <= 2^(b-1) - 1, step = absmax / (2^(b-1) - 1):
/// exact zeros survive (unused embedding rows stay 0), one code is left unused.
/// Needs b >= 2; 1 bit always uses the full (sign) grid.
struct zero {
  static constexpr const char* name = "zero";
};
}  // namespace grid

/// Symmetric absmax quantizer with `Bits`-bit codes over blocks of `Block` values.
///
/// Block 128 by default: a block's codes are then 16*b bytes, a whole number of
/// 16-byte vectors for every b, and the fp32 step costs 1/(32*b) of the payload
/// (6.25% at 4 bits); smaller blocks track outliers better but pay more metadata.
/// The step is fp32, so every float exponent range is representable (an fp16 scale
/// would zero blocks below ~6e-8 and overflow above 65504). Only blocks whose absmax is
/// itself near the subnormal range (below 2^(b-127)) lose relative precision, because
/// their step is subnormal: their absolute error stays below 2^(b-150).
template <int Bits, int Block = 128, class Grid = grid::full>
struct absmax {
  static_assert(Bits >= 1 && Bits <= 16,
                "lowbit::quant::absmax: the code width Bits must be in 1..16");
  static_assert(Block > 0 && Block % 32 == 0,
                "lowbit::quant::absmax: the block size must be a positive multiple of 32");

  static constexpr bool is_lowbit_quantizer = true;
  static constexpr int bits = Bits;
  static constexpr int block_size = Block;
  static constexpr bool zero_grid = std::is_same_v<Grid, grid::zero> && Bits >= 2;
  static constexpr const char* name = "absmax";
  static constexpr bool symmetric = true;  ///< make_meta reads absmax() and poisoned()

  /// What travels in the frame for each block.
  struct meta_type {
    float step;  ///< grid step; nan when the block held inf or nan
  };
  /// What encoding needs, derived once per block from the meta.
  ///
  /// The scaling is bounded by construction, so that the encoder needs no clamp (two
  /// instructions a value in the encode kernel): inv_step is 1/step rounded to nearest
  /// and then three floats down, and x * inv_step is rounded towards zero. With u = 2^-24,
  /// a normal step = absmax / levels rounded to nearest is >= (absmax / levels)(1 - u);
  /// 1/step rounded is <= (1/step)(1 + u), and a float's ulp is at least u times it, so
  /// inv_step <= (1/step)(1 + u)(1 - 3u); then |x| * inv_step <= levels (1 + u)(1 - 3u) /
  /// (1 - u) < levels. The price is a position up to 8u (relative) short of x / step:
  /// at most 8u * levels of a step at the grid's ends, below the 2^-16 of a step that
  /// stochastic rounding resolves up to 6 bits and 0.016 of a step at 16 bits; under
  /// 5e-7 of the value at every width. Steps outside [FLT_MIN, max_scaled_step] (where
  /// the step or the reciprocal is subnormal, infinite or nan, the last a poisoned block)
  /// divide and clamp instead. So do the steps make_meta took one float below the rounded
  /// quotient (absmax within a few floats of FLT_MAX): such a step is below
  /// absmax / levels, the premise above fails, and |x| / step may exceed levels. They are
  /// told apart by the float above them, whose outermost level overflows (a step that
  /// was not stepped down and shares that mark divides too, needlessly but correctly).
  struct params_type {
    meta_type meta;
    float inv_step = 0.0f;  ///< just below 1/step; 0 for an all-zero block
    bool divide = false;    ///< divide by the step and clamp (see above)
  };

  /// The largest step encoded by the bounded scaling: 2^125, whose reciprocal three floats
  /// down is still a normal float (above FLT_MIN = 2^-126), so flushing subnormals to zero
  /// (--use_fast_math) cannot zero it.
  static constexpr float max_scaled_step = 4.25352958651173079329e+37f;

  static constexpr int half_levels = 1 << (Bits - 1);
  static constexpr int qmax = half_levels - 1;
  static constexpr int qmin = zero_grid ? -(half_levels - 1) : -half_levels;
  /// absmax / step: the outermost level's position, +-levels.
  static constexpr float levels =
      zero_grid ? static_cast<float>(half_levels - 1) : static_cast<float>(half_levels) - 0.5f;

  /// The full grid's level construction (dequantize): the float with bits
  /// `level_bits | code << 1` is 2^22 + code + 1/2, and subtracting `level_base` leaves
  /// q + 1/2. Named here so that a kernel fusing the unpacking with it uses the same bits.
  static constexpr std::uint32_t level_bits = 0x4a800001u;  // 2^22 + 1/2
  static constexpr float level_base = 4194304.0f + static_cast<float>(half_levels);

  /// The same construction for a code left where it lies in a packed word, at bits
  /// [K, K + Bits) with 1 <= K and K + Bits <= 23, so that a decoder needs no shift to
  /// bring it to bit 1: the float with bits level_bits_at<K> | (word & code_mask << K) has
  /// the exponent of 2^(23-K), whose mantissa bit K weighs 1 and bit K - 1 (set in
  /// level_bits_at) weighs 1/2, and the code's bits lie inside the mantissa: it is
  /// 2^(23-K) + code + 1/2. level_base_at<K> = 2^(23-K) + half_levels is a float (an
  /// integer below 2^(24-K), a multiple of its ulp 2^-K), both lie in [2^(23-K), 2^(24-K))
  /// (code + 1/2 and half_levels are below 2^(Bits) <= 2^(23-K)), so their difference is
  /// exact (Sterbenz): q + 1/2, the value level_bits and level_base give (K = 1 is they).
  static constexpr std::uint32_t code_mask = (1u << Bits) - 1u;
  template <int K>
  static constexpr std::uint32_t level_bits_at = (static_cast<std::uint32_t>(150 - K) << 23) |
                                                 (1u << (K - 1));
  template <int K>
  static constexpr float level_base_at = static_cast<float>(1u << (23 - K)) +
                                         static_cast<float>(half_levels);

  /// How a decoder takes a packed word's codes with level_at (widths dividing 32): in
  /// chunks of `level_chunk_codes` consecutive codes, each chunk's word shifted once (right
  /// by level_chunk_shift(j) for the chunk of code j of the word; a negative shift is to the
  /// left) so that its m-th code lies at bit level_chunk_place(m). More codes a chunk
  /// means fewer shifts and more level constants (a register each on the GPU): at most 4,
  /// and a chunk must fit below the mantissa's top (its place + its span <= 23). A chunk
  /// is put at its own place when that fits (the word's second chunk then needs no shift),
  /// else at bit 1 (one place up, as level_bits has it).
  static constexpr int level_codes_per_word = 32 / Bits;
  static constexpr int level_chunk_codes = [] {
    int n = 1;
    while (2 * n <= 4 && 2 * n <= level_codes_per_word && 2 * n * Bits <= 22) n *= 2;
    return n;
  }();
  static constexpr int level_chunk_first_bit =
      2 * level_chunk_codes * Bits <= 23 ? level_chunk_codes * Bits : 1;
  LOWBIT_HD static constexpr int level_chunk_place(int m) {
    return level_chunk_first_bit + m * Bits;
  }
  LOWBIT_HD static constexpr int level_chunk_shift(int j) {
    return Bits * (j - j % level_chunk_codes) - level_chunk_first_bit;
  }

  /// q + 1/2 of the full grid's code at bits [K, K + Bits) of `word` (see level_bits_at):
  /// the same float as fsub(bits_float(level_bits | code << 1), level_base).
  template <int K>
  LOWBIT_HD static float level_at(std::uint32_t word) {
    static_assert(!zero_grid, "lowbit::quant::absmax::level_at: the full grid's construction");
    static_assert(K >= 1 && K + Bits <= 23,
                  "lowbit::quant::absmax::level_at: the code must lie in the mantissa above bit 0");
    return detail::fsub(detail::bits_float(level_bits_at<K> | (word & (code_mask << K))),
                        level_base_at<K>);
  }

  /// First-frame sums. A sum of frames starts from 0.0f: acc = fadd(0.0f, fmul(l, step)) for
  /// the first frame's level l = q + 1/2. ffma(l, step, 0.0f) gives the same bits whenever
  /// first_sum_fusable(step), and saves the addition:
  ///  - l * step nonzero and not rounding to zero: both round the same real product once,
  ///    and adding 0 to a nonzero float leaves it;
  ///  - l * step an exact zero (step +-0; l is never 0): fmul gives a zero signed as the
  ///    product, fadd(0.0f, +-0) is +0, and the exact sum l * step + 0 of two zeros is +0
  ///    in round-to-nearest (signs differ, or both +0) -- the same +0;
  ///  - inf or nan step: l * step is +-inf (then both give it) or nan (both nan).
  /// What remains is a nonzero product that rounds to zero: fmul gives -0 for a negative
  /// one, which fadd turns into +0, while the fused form keeps the exact sum's sign, -0.
  /// With |l| >= 1/2 that needs |step| <= 2^-149 (the smallest subnormal), and a device
  /// flushing subnormal results (-ftz) also flushes products below 2^-126, which needs
  /// |step| < 2^-125; steps of magnitude in (0, 2^-124) are excluded for both, with margin.
  static constexpr float first_sum_min_step = 0x1p-124f;
  LOWBIT_HD static bool first_sum_fusable(float step) {
    const float a = detail::abs_f(step);
    return a == 0.0f || !(a < first_sum_min_step);  // nan: fusable (both give nan)
  }
  LOWBIT_HD static float first_sum(float level, float step) {
    return detail::ffma(level, step, 0.0f);
  }

  /// True when the outermost level of `step`, levels * step, rounds to inf.
  LOWBIT_HD static bool outer_level_overflows(float step) {
    return !(detail::fmul(step, levels) <= FLT_MAX);
  }

  LOWBIT_HD static meta_type make_meta(const block_stats& s) {
    if (s.poisoned()) return {detail::quiet_nan()};
    // Finite in, finite out. The step is absmax / levels rounded to nearest, so the
    // outermost level levels * step may round above FLT_MAX when the quotient rounded up
    // and absmax is within a few floats of FLT_MAX; every level is then stepped one float
    // down, which is enough: for b >= 2 (levels >= 1, the quotient finite) rounding chose
    // the step over the float below it, so absmax / levels is at least their midpoint,
    // above the float below; levels times that is below absmax <= FLT_MAX, and so is
    // every level (the decode's rounding cannot pass the float FLT_MAX). The end levels
    // then fall short of +-absmax by at most levels floats of the step (under 2^(b-24) of
    // a step), and the encoder clamps there (see params_type). At 1 bit (levels 1/2) the step 2 *
    // absmax is inf for absmax above FLT_MAX / 2: the float below is FLT_MAX, the levels
    // +-FLT_MAX / 2, still within a step of every input.
    const float step = detail::fdiv(s.absmax(), levels);
    return {outer_level_overflows(step) ? detail::float_below(step) : step};
  }

  LOWBIT_HD static params_type make_params(const meta_type& m) {
    params_type p{m, 0.0f, false};
    if (m.step >= FLT_MIN && m.step <= max_scaled_step &&
        !outer_level_overflows(detail::float_above(m.step))) {
      p.inv_step = detail::bits_float(detail::float_bits(detail::fdiv(1.0f, m.step)) - 3u);
    } else {
      p.divide = !(m.step == 0.0f);  // see max_scaled_step; nan: poisoned, coded Lo throughout
    }
    return p;
  }

  /// The code of x (|x| at most the block's absmax); `noise` feeds stochastic rounding.
  template <class Rounding>
  LOWBIT_HD static std::uint32_t quantize(float x, const params_type& p, std::uint32_t noise) {
    // Level q sits at (q + 1/2) * step on the full grid and at q * step on the zero
    // grid. Clamping before rounding equals clamping after it (the bounds are integers).
    constexpr float shift = zero_grid ? 0.0f : -0.5f;
    constexpr auto offset = static_cast<std::uint32_t>(qmin + half_levels);
    if (p.divide)
      return round::to_grid<Rounding, qmin, qmax>(detail::fdiv(x, p.meta.step), shift, noise) +
             offset;
    return round::to_grid_in_range<Rounding, qmin, qmax>(detail::fmul_rz(x, p.inv_step), shift,
                                                         noise) +
           offset;
  }

  /// quantize with the code left at bits [16, 32) and bits [0, 16) not the code's
  /// (quantize_high(x, p, noise) >> 16 == quantize(x, p, noise)), for a rounding with
  /// `index_high` (round::stochastic): what pack::pack_group_high takes.
  template <class Rounding>
  LOWBIT_HD static std::uint32_t quantize_high(float x, const params_type& p, std::uint32_t noise) {
    static_assert(round::has_index_high_v<Rounding>,
                  "lowbit::quant::absmax::quantize_high: the rounding must have index_high");
    constexpr float shift = zero_grid ? 0.0f : -0.5f;
    constexpr auto offset = static_cast<std::uint32_t>(qmin + half_levels) << 16;
    if (p.divide)
      return round::to_grid_high<Rounding, qmin, qmax>(detail::fdiv(x, p.meta.step), shift, noise) +
             offset;
    return round::to_grid_in_range_high<Rounding, qmin, qmax>(detail::fmul_rz(x, p.inv_step), shift,
                                                              noise) +
           offset;
  }

  /// The value code stands for.
  ///
  /// The level's position q (+ 1/2 on the full grid) is formed exactly without an
  /// int-to-float conversion (a quarter-rate instruction on the GPU): on the full grid the
  /// float with bits level_bits + 2 code + 1 is 2^22 + code + 1/2 (floats in [2^22, 2^23)
  /// are 1/2 apart), and subtracting 2^22 + half_levels leaves q + 1/2 exactly, one
  /// integer operation (fused with the unpacking shift) and one addition where float_of
  /// and + 1/2 took two additions. Exact either way, so the bits are those of
  /// fmul(q + 1/2, step).
  LOWBIT_HD static float dequantize(std::uint32_t code, const meta_type& m) {
    if constexpr (zero_grid) {
      return detail::fmul(detail::float_of(static_cast<int>(code) - half_levels), m.step);
    } else {
      return detail::fmul(detail::fsub(detail::bits_float(level_bits | (code << 1)), level_base),
                          m.step);
    }
  }

  /// Grid step of a block: the unit of the error bounds.
  LOWBIT_HD static float step(const meta_type& m) { return m.step; }
};

}  // namespace lowbit::quant
