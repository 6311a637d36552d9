// Asymmetric min/max integer quantizer: an fp32 offset and step per block.
#pragma once

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
    float min;   ///< the block's smallest value (nan when poisoned)
    float step;  ///< grid step (nan when poisoned)
  };
  using params_type = scaled_params<meta_type>;

  LOWBIT_HD static meta_type make_meta(const block_stats& s) {
    if (s.poisoned()) return {detail::quiet_nan(), detail::quiet_nan()};
    const float range = detail::fsub(s.max, s.min);
    // A range that overflows (max - min > FLT_MAX) is split in two halves first.
    if (detail::is_nonfinite(range)) {
      const float half = detail::fsub(detail::fmul(s.max, 0.5f), detail::fmul(s.min, 0.5f));
      return {s.min, detail::fmul(detail::fdiv(half, static_cast<float>(max_code)), 2.0f)};
    }
    return {s.min, detail::fdiv(range, static_cast<float>(max_code))};
  }

  LOWBIT_HD static params_type make_params(const meta_type& m) {
    return make_scaled_params(m, m.step);
  }

  template <class Rounding>
  LOWBIT_HD static std::uint32_t quantize(float x, const params_type& p, std::uint32_t noise) {
    const float d = detail::fsub(x, p.meta.min);
    const float t = p.scale(d, p.meta.step);
    return round::to_grid<Rounding, 0, max_code>(t, 0.0f, noise);
  }

  LOWBIT_HD static float dequantize(std::uint32_t code, const meta_type& m) {
    return detail::fadd(m.min, detail::fmul(detail::float_of(static_cast<int>(code)), m.step));
  }

  LOWBIT_HD static float step(const meta_type& m) { return m.step; }
};

}  // namespace lowbit::quant
