// How much each choice perturbs training: QSync's variance indicator for compute
// precisions, and the codec's quantization variance for communication bits.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <vector>

#include "lowbit/core/error.hpp"
#include "lowbit/qsync/op_graph.hpp"
#include "lowbit/qsync/precision.hpp"

namespace lowbit::qsync {

/// QSync's depth weight of forward perturbation against backward perturbation.
inline constexpr double default_gamma = 4.0;

/// An op's forward and backward perturbation at one precision.
struct perturbation {
  double forward = 0.0;
  double backward = 0.0;
};

/// The exponent of `absmax` clipped into `p`'s normal range (QSync's "clipped fp16
/// exponent" e, generalised to every float format).
inline int clipped_exponent(double absmax, precision p) {
  if (!(absmax > 0.0)) return min_exponent(p);
  // Clamp in double first: casting inf (or a huge log) to int is undefined.
  const double e = std::floor(std::log2(absmax));
  return static_cast<int>(
      std::clamp(e, static_cast<double>(min_exponent(p)), static_cast<double>(max_exponent(p))));
}

/// The rounding-variance factor of a float format for a tensor whose amax is `absmax`:
/// 2^(2e) * 2^(2 - 2m) with m mantissa bits. For fp16 (m = 10) this is QSync's
/// 2^(2e) * 2^-18; bf16, tf32 and fp8 (E4M3) follow from their mantissas.
inline double float_factor(double absmax, precision p) {
  return std::ldexp(1.0, 2 * clipped_exponent(absmax, p) + 2 - 2 * mantissa_bits(p));
}

/// The int8 factor S^2 with S = amax / 127, the per-tensor scale.
inline double int8_factor(double absmax) { return (absmax / 127.0) * (absmax / 127.0); }

/// QSync's per-op perturbation at `p` (REFERENCE.md), with v the input activation,
/// w the weight and g the output gradient:
///   int8:  fwd = (|W| Sv^2 Dv + |X| Sw^2 Dw) / 6,
///          bwd = (|dW| Sv^2 Dv + |X| F16(g) Dg) / 6     (the gradient stays fp16),
///   float: fwd = (|W| F(v) Dv + |X| F(w) Dw) / 6,
///          bwd = (|dW| F(v) Dv + |X| F(g) Dg) / 6,
///   fp32:  0,
/// where F = float_factor at that format. `weight_numel` is Dw.
inline perturbation op_perturbation(const tensor_stats& s, double weight_numel, precision p) {
  if (p == precision::fp32) return {};
  const double dv = s.input_numel, dw = weight_numel, dg = s.grad_output_numel;
  if (p == precision::int8) {
    const double sv = int8_factor(s.input_absmax), sw = int8_factor(s.weight_absmax);
    const double g16 = float_factor(s.grad_output_absmax, precision::fp16);
    return {(s.weight_norm * sv * dv + s.input_norm * sw * dw) / 6.0,
            (s.grad_weight_norm * sv * dv + s.input_norm * g16 * dg) / 6.0};
  }
  const double fv = float_factor(s.input_absmax, p), fw = float_factor(s.weight_absmax, p);
  const double fg = float_factor(s.grad_output_absmax, p);
  return {(s.weight_norm * fv * dv + s.input_norm * fw * dw) / 6.0,
          (s.grad_weight_norm * fv * dv + s.input_norm * fg * dg) / 6.0};
}

/// Depth-weighted score: gamma (L - depth) fwd + depth bwd. Forward error early in the
/// network passes through the L - depth layers after it; backward error late in it
/// passes through the depth layers before it. depth is 0-based.
inline double op_score(const perturbation& q, std::size_t depth, std::size_t layers,
                       double gamma = default_gamma) {
  LOWBIT_EXPECTS(depth < layers, "depth must be below the layer count");
  return gamma * static_cast<double>(layers - depth) * q.forward +
         static_cast<double>(depth) * q.backward;
}

/// Scores of every parameter op of `g` at every precision, scores[i][index_of(p)];
/// zero for parameter-free ops, which are no decision. L counts parameter ops and
/// depth is an op's rank among them in topological order.
inline std::vector<std::array<double, precision_count>> op_scores(const op_graph& g,
                                                                  double gamma = default_gamma) {
  std::vector<std::array<double, precision_count>> out(g.size());
  std::size_t layers = 0;
  for (const op& o : g.ops()) layers += o.has_params() ? 1 : 0;
  std::size_t depth = 0;
  for (std::size_t i : g.topo_order()) {
    const op& o = g.at(i);
    if (!o.has_params()) continue;
    for (precision p : all_precisions)
      out[i][index_of(p)] =
          op_score(op_perturbation(o.stats, o.param_numel, p), depth, layers, gamma);
    ++depth;
  }
  return out;
}

/// Per-element variance one encode at `bits` adds to a block whose amax is `absmax`.
/// Quantized widths (1..15) round to nearest on a grid of step 2 amax / 2^b (the codec
/// uses all 2^b levels), variance step^2 / 12. bits = 16 is bf16 (step 2^(e-7)) and
/// bits = 32 is exact.
inline double codec_variance(int bits, double absmax) {
  LOWBIT_EXPECTS(bits >= 1 && (bits <= 16 || bits == 32), "communication bits must be 1..16 or 32");
  if (bits == 32) return 0.0;
  double step;
  if (bits == 16)
    step =
        std::ldexp(1.0, clipped_exponent(absmax, precision::bf16) - mantissa_bits(precision::bf16));
  else
    step = 2.0 * absmax / std::ldexp(1.0, bits);
  return step * step / 12.0;
}

/// Gradient statistics of one bucket for the communication indicator.
struct bucket_stats {
  double grad_norm = 0.0;     ///< |g| over the bucket
  double block_absmax = 0.0;  ///< typical amax of a 128-element block
  double numel = 0.0;
};

/// Bucket statistics from its ops' weight-gradient norms. Without per-block data the
/// block amax is taken as 3 x the gradient's RMS (a 128-sample Gaussian maximum).
inline bucket_stats estimate_bucket_stats(const op_graph& g, const std::vector<std::size_t>& ops) {
  bucket_stats s;
  double sq = 0;
  for (std::size_t i : ops) {
    sq += g.at(i).stats.grad_weight_norm * g.at(i).stats.grad_weight_norm;
    s.numel += g.at(i).param_numel;
  }
  s.grad_norm = std::sqrt(sq);
  s.block_absmax = s.numel > 0 ? 3.0 * s.grad_norm / std::sqrt(s.numel) : 0.0;
  return s;
}

/// Communication score of a bucket at `bits`, on the same |norm| x variance x numel scale
/// as the compute indicator: |g| * codec_variance * numel * stages, where a quantized
/// all-reduce encodes twice (the shards, then the reduced shard) and bf16 rounds once.
inline double comm_score(const bucket_stats& s, int bits) {
  const double stages = bits < 16 ? 2.0 : 1.0;
  return s.grad_norm * codec_variance(bits, s.block_absmax) * s.numel * stages;
}

}  // namespace lowbit::qsync
