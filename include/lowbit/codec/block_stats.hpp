// The statistics a quantizer takes of one block before it picks the block's scale.
// Every quantizer uses the same (min, max) pair so that a kernel reduces one shape of
// data whatever the policy; min and max are exact and order-independent, which keeps
// host and device bit-identical however the reduction is split.
#pragma once

#include <cfloat>

#include "lowbit/core/config.hpp"
#include "lowbit/core/float_ops.hpp"

namespace lowbit::quant {

/// min and max of a block's values. A non-finite value (inf or nan) sets max to +inf,
/// which finite data can never produce: that is the block's "poisoned" mark.
struct block_stats {
  float min = FLT_MAX;
  float max = -FLT_MAX;

  LOWBIT_HD void add(float x) {
    if (detail::is_nonfinite(x)) {
      max = detail::bits_float(0x7f800000u);
    } else {
      min = detail::min_f(min, x);
      max = detail::max_f(max, x);
    }
  }
  LOWBIT_HD void merge(const block_stats& other) {
    min = detail::min_f(min, other.min);
    max = detail::max_f(max, other.max);
  }
  /// True when the block held inf or nan: it must decode to nan.
  LOWBIT_HD bool poisoned() const { return detail::is_nonfinite(max); }
  /// max |x| over the block.
  LOWBIT_HD float absmax() const { return detail::max_f(-min, max); }
};

/// A quantizer's per-block encoding constants: its meta, 1/step, and whether 1/step
/// overflows (a subnormal step), in which case the encoder divides instead.
template <class Meta>
struct scaled_params {
  Meta meta;
  float inv_step = 0.0f;  ///< 0 for an all-zero or poisoned block: every code is then 0
  bool divide = false;

  /// x / step: by the reciprocal in the common case, by IEEE division when it overflows.
  LOWBIT_HD float scale(float x, float step) const {
    return divide ? detail::fdiv(x, step) : detail::fmul(x, inv_step);
  }
};

/// The scaled_params of a block whose grid spacing is `step` (0 or nan: all codes 0).
template <class Meta>
LOWBIT_HD scaled_params<Meta> make_scaled_params(const Meta& m, float step) {
  scaled_params<Meta> p{m, 0.0f, false};
  if (step > 0.0f) {  // false for 0 and nan
    p.inv_step = detail::fdiv(1.0f, step);
    p.divide = detail::is_nonfinite(p.inv_step);
  }
  return p;
}

}  // namespace lowbit::quant
