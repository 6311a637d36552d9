// FP8 quantizers (E4M3 and E5M2, OCP formats) with an fp32 scale per block.
#pragma once

#include <cfloat>
#include <cstdint>

#include "lowbit/codec/block_stats.hpp"
#include "lowbit/core/config.hpp"
#include "lowbit/core/float_ops.hpp"

namespace lowbit::quant {

/// An 8-bit float format: exponent bits, mantissa bits, largest finite value.
template <int ExpBits, int ManBits, int MaxBiasedExp, int MaxMantissa>
struct fp8_format {
  static constexpr int exp_bits = ExpBits;
  static constexpr int man_bits = ManBits;
  static constexpr int bias = (1 << (ExpBits - 1)) - 1;
  static constexpr int emin = 1 - bias;  ///< exponent of the smallest normal
  static constexpr int emax = MaxBiasedExp - bias;
  static constexpr int max_mantissa = MaxMantissa;  ///< of the largest finite value
  /// Largest finite value: (2^M + max_mantissa) * 2^(emax - M).
  static constexpr float max_value = static_cast<float>((1 << ManBits) + MaxMantissa) *
                                     static_cast<float>(1 << (MaxBiasedExp - bias)) /
                                     static_cast<float>(1 << ManBits);
};

/// E4M3 ("fn": no infinities, largest finite 448).
using e4m3 = fp8_format<4, 3, 15, 6>;
/// E5M2 (IEEE-like, largest finite 57344).
using e5m2 = fp8_format<5, 2, 30, 3>;

/// FP8 codes with an fp32 per-block scale that maps the block's absmax onto the
/// format's largest finite value. Rounding policies round on the fp8 grid.
template <class Format, int Block = 128>
struct fp8 {
  static_assert(Block > 0 && Block % 32 == 0,
                "lowbit::quant::fp8: the block size must be a positive multiple of 32");

  static constexpr bool is_lowbit_quantizer = true;
  static constexpr int bits = 8;
  static constexpr int block_size = Block;
  static constexpr const char* name = Format::exp_bits == 4 ? "fp8e4m3" : "fp8e5m2";
  static constexpr bool symmetric = true;  ///< make_meta reads absmax() and poisoned()

  struct meta_type {
    float scale;  ///< value = fp8(code) * scale; nan when poisoned
  };
  using params_type = scaled_params<meta_type>;

  LOWBIT_HD static meta_type make_meta(const block_stats& s) {
    if (s.poisoned()) return {detail::quiet_nan()};
    // Finite in, finite out: the largest code decodes to max_value * scale, which may
    // round above FLT_MAX when the scale rounded up and absmax is within a few floats of
    // FLT_MAX; the float below the scale is then under absmax / max_value (rounding
    // chose the scale over it), so every code decodes to at most absmax, and the encoder
    // clamps the few inputs beyond the largest code. For E4M3 and E5M2 this never
    // happens (their max_value is 7 * 2^k, and no float near FLT_MAX divided by 7 rounds
    // up far enough), but other formats' can.
    const float scale = detail::fdiv(s.absmax(), Format::max_value);
    return {detail::fmul(scale, Format::max_value) <= FLT_MAX ? scale : detail::float_below(scale)};
  }

  LOWBIT_HD static params_type make_params(const meta_type& m) {
    return make_scaled_params(m, m.scale);
  }

  template <class Rounding>
  LOWBIT_HD static std::uint32_t quantize(float x, const params_type& p, std::uint32_t noise) {
    constexpr int M = Format::man_bits;
    const float y = p.scale(x, p.meta.scale);
    const std::uint32_t sign = (detail::float_bits(x) >> 31) << 7;
    const float a = detail::clamp_f(detail::abs_f(y), 0.0f, Format::max_value);
    // The binade of a (floats below 2^emin share the subnormal spacing).
    int e = static_cast<int>((detail::float_bits(a) >> 23) & 0xffu) - 127;
    if (e < Format::emin) e = Format::emin;
    // a / ulp is exact: scaling by a power of two.
    const float t = detail::fmul(a, detail::pow2(M - e));
    int r = detail::int_of(Rounding::apply(t, noise));
    if (r == (2 << M)) {  // rounded up into the next binade
      ++e;
      r = 1 << M;
    }
    if (e > Format::emax || (e == Format::emax && r > (1 << M) + Format::max_mantissa)) {
      e = Format::emax;
      r = (1 << M) + Format::max_mantissa;
    }
    if (r < (1 << M)) return sign | static_cast<std::uint32_t>(r);  // subnormal (or zero)
    const auto biased = static_cast<std::uint32_t>(e - Format::emin + 1);
    return sign | (biased << M) | static_cast<std::uint32_t>(r - (1 << M));
  }

  /// The value of an fp8 code before the block scale.
  LOWBIT_HD static float fp8_value(std::uint32_t code) {
    constexpr int M = Format::man_bits;
    const int biased = static_cast<int>((code >> M) & ((1u << Format::exp_bits) - 1u));
    const int mant = static_cast<int>(code & ((1u << M) - 1u));
    const float magnitude =
        biased == 0 ? detail::fmul(detail::float_of(mant), detail::pow2(Format::emin - M))
                    : detail::fmul(detail::float_of((1 << M) + mant),
                                   detail::pow2(biased - 1 + Format::emin - M));
    return (code & 0x80u) ? -magnitude : magnitude;
  }

  LOWBIT_HD static float dequantize(std::uint32_t code, const meta_type& m) {
    return detail::fmul(fp8_value(code), m.scale);
  }

  /// The largest grid spacing in the block: an upper bound for error tests.
  LOWBIT_HD static float step(const meta_type& m) {
    return detail::fmul(m.scale, detail::pow2(Format::emax - Format::man_bits));
  }
};

}  // namespace lowbit::quant
