// Asymmetric min/max integer quantizer: an fp32 offset and step per block.
#pragma once

#include <cfloat>
#include <cstdint>

#include "lowbit/codec/block_stats.hpp"
#include "lowbit/codec/rounding.hpp"
#include "lowbit/core/config.hpp"
#include "lowbit/core/float_ops.hpp"

namespace lowbit::quant {

/// Asymmetric quantizer: levels min + k * step, k in [0, 2^b), step = (max-min)/(2^b-1).
/// Better than absmax on one-sided data (activations after ReLU, Adam moments); costs
/// 8 bytes of metadata per block instead of 4.
template <int Bits, int Block = 128>
struct minmax {
  static_assert(Bits >= 1 && Bits <= 16,
                "lowbit::quant::minmax: the code width Bits must be in 1..16");
  static_assert(Block > 0 && Block % 32 == 0,
                "lowbit::quant::minmax: the block size must be a positive multiple of 32");

  static constexpr bool is_lowbit_quantizer = true;
  static constexpr int bits = Bits;
  static constexpr int block_size = Block;
  static constexpr const char* name = "minmax";
  static constexpr std::uint32_t max_code = (1u << Bits) - 1u;

  struct meta_type {
    float min;   ///< the grid's lowest level: the block's min (nan when poisoned)
    float step;  ///< grid step (nan when poisoned)
  };
  /// What encoding needs, derived once per block from the meta. The position of x is
  /// (x - origin) / step + offset. origin is min (offset 0) unless the grid spans more
  /// than FLT_MAX (max_code * step overflows: the block's max - min does), where x - min
  /// would overflow for the upper part of the block; origin is then the grid's middle,
  /// min + (max_code / 2) * step, at offset max_code / 2, and |x - origin| stays within
  /// about half the grid, below FLT_MAX (it reaches inf only beyond the end levels, where
  /// the clamp gives the end code anyway). The offset rides in the fused multiply-add
  /// that scales the position, so it costs no instruction: with offset 0 the position is
  /// the plain product, bit for bit.
  struct params_type {
    meta_type meta;
    float origin = 0.0f;    ///< where positions are measured from
    float offset = 0.0f;    ///< origin's position on the grid: 0 or max_code / 2
    float inv_step = 0.0f;  ///< 1/step; 0 for a constant or poisoned block (all codes 0)
    bool divide = false;    ///< 1/step overflows (a subnormal step): divide instead
  };

  /// The top level min + max_code * step (rounded once, as dequantize rounds it).
  LOWBIT_HD static float top_level(float min, float step) {
    return detail::ffma(static_cast<float>(max_code), step, min);
  }

  LOWBIT_HD static meta_type make_meta(const block_stats& s) {
    if (s.poisoned()) return {detail::quiet_nan(), detail::quiet_nan()};
    float min = s.min, step;
    const float range = detail::fsub(s.max, s.min);
    if (!detail::is_nonfinite(range)) {
      step = detail::fdiv(range, static_cast<float>(max_code));
    } else {
      // max - min above FLT_MAX: it is halved first (the halves are exact).
      const float half = detail::fsub(detail::fmul(s.max, 0.5f), detail::fmul(s.min, 0.5f));
      step = detail::fmul(detail::fdiv(half, static_cast<float>(max_code)), 2.0f);
      if (detail::is_nonfinite(step)) {
        // 1 bit, where the step is the range itself: no float reaches it. The step is
        // FLT_MAX and the two levels sit +-FLT_MAX / 2 about the block's middle (which
        // lies within FLT_MAX / 2 of 0): the part of the range they miss is split evenly,
        // and every input stays within half a step of a level, as nearest rounding
        // promises.
        step = FLT_MAX;
        const float middle = detail::fadd(detail::fmul(s.min, 0.5f), detail::fmul(s.max, 0.5f));
        min = detail::fsub(middle, 0.5f * FLT_MAX);
      }
    }
    // Finite in, finite out: the rounded step may put the top level above FLT_MAX when
    // max is near FLT_MAX. The step then goes down a float at a time: at most twice,
    // since it took two roundings (the range, the quotient), each within a float, and
    // two floats below it the step is under (max - min) / max_code, which puts the top
    // level below max. Every level is at most the top level and at least min.
    while (!(top_level(min, step) <= FLT_MAX)) step = detail::float_below(step);
    return {min, step};
  }

  LOWBIT_HD static params_type make_params(const meta_type& m) {
    params_type p{m, m.min, 0.0f, 0.0f, false};
    if (m.step > 0.0f) {  // false for 0 and nan
      p.inv_step = detail::fdiv(1.0f, m.step);
      // A subnormal step: its grid is far narrower than FLT_MAX, so the offset stays 0.
      p.divide = detail::is_nonfinite(p.inv_step);
      if (detail::is_nonfinite(detail::fmul(static_cast<float>(max_code), m.step))) {
        p.offset = 0.5f * static_cast<float>(max_code);  // exact: max_code < 2^16
        p.origin = detail::ffma(p.offset, m.step, m.min);
      }
    }
    return p;
  }

  template <class Rounding>
  LOWBIT_HD static std::uint32_t quantize(float x, const params_type& p, std::uint32_t noise) {
    const float d = detail::fsub(x, p.origin);
    const float t = p.divide ? detail::fdiv(d, p.meta.step) : detail::ffma(d, p.inv_step, p.offset);
    return round::to_grid<Rounding, 0, max_code>(t, 0.0f, noise);
  }

  /// min + code * step, rounded once: the product alone may overflow where the sum does
  /// not (a grid wider than FLT_MAX), and one fused instruction is also the cheaper
  /// decode.
  LOWBIT_HD static float dequantize(std::uint32_t code, const meta_type& m) {
    return detail::ffma(detail::float_of(static_cast<int>(code)), m.step, m.min);
  }

  LOWBIT_HD static float step(const meta_type& m) { return m.step; }
};

}  // namespace lowbit::quant
