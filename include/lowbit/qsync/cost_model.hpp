// Per-operator latency on one device (measured when known, roofline otherwise), cast
// costs, and the memory an iteration needs.
#pragma once

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/core/error.hpp"
#include "lowbit/qsync/device_profile.hpp"
#include "lowbit/qsync/op_graph.hpp"
#include "lowbit/qsync/precision.hpp"

namespace lowbit::qsync {

/// GPU time of one op's forward and backward kernels, milliseconds; a negative value
/// in a measured table means "not measured" and falls back to the roofline.
struct op_time {
  double forward_ms = 0.0;
  double backward_ms = 0.0;
};

/// Measured op times for one device model, keyed by op name and precision (QSync
/// profiles each uniform precision once and looks ops up in those profiles).
class measured_table {
 public:
  /// Records (or replaces) the time of `op_name` at `p`.
  void set(const std::string& op_name, precision p, op_time t) { table_[op_name][index_of(p)] = t; }
  /// The time of `op_name` at `p`, or null when it was not measured.
  const op_time* find(std::string_view op_name, precision p) const {
    auto it = table_.find(op_name);
    if (it == table_.end() || !it->second[index_of(p)]) return nullptr;
    return &*it->second[index_of(p)];
  }
  /// Number of ops with at least one measurement.
  std::size_t size() const noexcept { return table_.size(); }
  /// Names of the measured ops (to report ones the graph does not know).
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& kv : table_) out.push_back(kv.first);
    return out;
  }

 private:
  std::map<std::string, std::array<std::optional<op_time>, precision_count>, std::less<>> table_;
};

/// The precisions `o` may run at on `dev`: the op's own list (or all) intersected with
/// the device's menu and modes, without 8-bit ones for 16-bit-floor kinds; ascending.
/// Throws invalid_argument naming the op and device when nothing is left.
inline std::vector<precision> allowed_precisions(const op& o, const device_profile& dev) {
  std::vector<precision> out;
  for (precision p : dev.precisions) {
    if (!dev.supports(p)) continue;
    if (keeps_16_bits(o.kind) && storage_bits(p) < 16) continue;
    if (!o.allowed.empty() && std::find(o.allowed.begin(), o.allowed.end(), p) == o.allowed.end())
      continue;
    out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  LOWBIT_EXPECTS(!out.empty(),
                 "op '" + o.name + "' has no precision that device '" + dev.name + "' offers");
  return out;
}

/// Of `menu` (ascending), the precision closest to `wanted`: the lowest one at or above
/// it, else the highest below. Used for uniform baselines and parameter-free followers.
inline precision nearest_allowed(const std::vector<precision>& menu, precision wanted) {
  for (precision p : menu)
    if (p >= wanted) return p;
  return menu.back();
}

/// Latency of ops, casts and the optimizer step on one device model.
class cost_model {
 public:
  /// A model of `dev`, preferring `measured` times where present.
  explicit cost_model(device_profile dev, measured_table measured = {})
      : dev_(std::move(dev)), measured_(std::move(measured)) {}

  /// The device this model describes.
  const device_profile& device() const noexcept { return dev_; }
  /// The measured table.
  const measured_table& measured() const noexcept { return measured_; }

  /// GPU time of `o` at `p` (clamped to the op's 16-bit floor): the measured value when
  /// there is one, the roofline otherwise.
  op_time time(const op& o, precision p) const {
    p = clamp_precision(o.kind, p);
    const op_time* t = measured_.find(o.name, p);
    if (t && t->forward_ms >= 0 && t->backward_ms >= 0) return *t;
    op_time r = roofline(o, p);
    if (t && t->forward_ms >= 0) r.forward_ms = t->forward_ms;
    if (t && t->backward_ms >= 0) r.backward_ms = t->backward_ms;
    return r;
  }

  /// Roofline estimate: max(FLOPs / peak, bytes / bandwidth), with fp32 bytes scaled by
  /// the precision's storage width. Backward is two GEMMs (data and weight gradients)
  /// for ops with parameters and one pass otherwise, over twice the traffic.
  op_time roofline(const op& o, precision p) const {
    LOWBIT_EXPECTS(dev_.supports(p), "device '" + dev_.name + "' has no " + to_string(p) +
                                         " mode (op '" + o.name + "')");
    const double bytes = o.bytes * storage_bits(p) / 32.0;
    const double fwd = std::max(o.flops / dev_.flops_per_ms(p), bytes / dev_.bytes_per_ms());
    const double bwd_flops = o.flops * (o.has_params() ? 2.0 : 1.0);
    const double bwd =
        std::max(bwd_flops / dev_.flops_per_ms(p), 2.0 * bytes / dev_.bytes_per_ms());
    return {fwd, bwd};
  }

  /// Milliseconds to cast `numel` elements from `from` to `to`.
  double cast_ms(precision from, precision to, double numel) const noexcept {
    return dev_.casts.cost(from, to, numel);
  }

  /// Milliseconds of the optimizer step over `params` fp32 parameters: memory-bound,
  /// reading weights, gradients and state and writing weights and state back.
  double optimizer_ms(double params, double state_bytes_per_param) const noexcept {
    const double bytes = params * (4.0 + 4.0 + 4.0 + 2.0 * state_bytes_per_param);
    return bytes / dev_.bytes_per_ms() + dev_.launch_ms;
  }

 private:
  device_profile dev_;
  measured_table measured_;
};

/// Bytes an iteration holds at its peak, by category.
struct memory_breakdown {
  double weights = 0.0;      ///< fp32 master weights
  double gradients = 0.0;    ///< fp32 gradients
  double optimizer = 0.0;    ///< optimizer state
  double activations = 0.0;  ///< saved activations at each op's precision
  /// Everything together, bytes.
  double total() const noexcept { return weights + gradients + optimizer + activations; }
};

/// Memory of one iteration with op `i` at `per_op[i]`: weights and gradients in fp32,
/// optimizer state, and each op's saved activations at its storage width (bits/32 of
/// the fp32 size), with 16-bit-floor kinds clamped to 16 bits.
inline memory_breakdown memory_bytes(const op_graph& g, const std::vector<precision>& per_op,
                                     double optimizer_bytes_per_param) {
  LOWBIT_EXPECTS(per_op.size() == g.size(), "one precision per op is needed");
  memory_breakdown m;
  const double params = g.total_params();
  m.weights = 4.0 * params;
  m.gradients = 4.0 * params;
  m.optimizer = optimizer_bytes_per_param * params;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const op& o = g.at(i);
    m.activations += o.saved_numel * storage_bits(clamp_precision(o.kind, per_op[i])) / 8.0;
  }
  return m;
}

}  // namespace lowbit::qsync
