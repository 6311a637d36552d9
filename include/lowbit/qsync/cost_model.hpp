// Per-operator latency on one device (measured when known, roofline otherwise), cast
// costs, and the memory an iteration needs.
#pragma once

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
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

/// What a profiled iteration spent outside every op, at one precision: the kernels no
/// op launched (optimizer step, gradient accumulation, parameter-free code between the
/// ops) and the host time outside every op (Python between ops, zero_grad, the
/// optimizer's launches). Negative means "not measured".
struct tail_time {
  double gpu_ms = -1.0;
  double cpu_ms = -1.0;
};

/// Measured op times for one device model, keyed by op name and precision (QSync
/// profiles each uniform precision once and looks ops up in those profiles): GPU time,
/// host time (the CPU chain), and the iteration's tail per profiled precision.
class measured_table {
 public:
  /// Records (or replaces) the GPU time of `op_name` at `p`.
  void set(const std::string& op_name, precision p, op_time t) { table_[op_name][index_of(p)] = t; }
  /// The GPU time of `op_name` at `p`, or null when it was not measured.
  const op_time* find(std::string_view op_name, precision p) const {
    return lookup_(table_, op_name, p);
  }
  /// Records the host time of `op_name` at `p` (forward and backward issue time, ms).
  void set_host(const std::string& op_name, precision p, op_time t) {
    host_[op_name][index_of(p)] = t;
  }
  /// The host time of `op_name` at `p`, or null when it was not measured.
  const op_time* find_host(std::string_view op_name, precision p) const {
    return lookup_(host_, op_name, p);
  }
  /// Records the GPU time of the code between the ops that runs before `op_name`'s forward
  /// and before its backward in a profile at `p` (trace_ranges::code_gpu_ms).
  void set_code(const std::string& op_name, precision p, op_time t) {
    code_[op_name][index_of(p)] = t;
  }
  /// The code before `op_name` in the profile at `p`, or null when it was not measured.
  const op_time* find_code(std::string_view op_name, precision p) const {
    return lookup_(code_, op_name, p);
  }
  /// Records the tail of an iteration profiled at `p`.
  void set_tail(precision p, tail_time t) { tails_[index_of(p)] = t; }
  /// The tail measured at `p`, or null.
  const tail_time* find_tail(precision p) const {
    return tails_[index_of(p)] ? &*tails_[index_of(p)] : nullptr;
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
  using per_op =
      std::map<std::string, std::array<std::optional<op_time>, precision_count>, std::less<>>;
  static const op_time* lookup_(const per_op& t, std::string_view op_name, precision p) {
    auto it = t.find(op_name);
    if (it == t.end() || !it->second[index_of(p)]) return nullptr;
    return &*it->second[index_of(p)];
  }
  per_op table_, host_, code_;
  std::array<std::optional<tail_time>, precision_count> tails_{};
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
  /// there is one, the roofline otherwise; no backward for an op without one
  /// (op::has_backward).
  op_time time(const op& o, precision p) const {
    p = clamp_precision(o.kind, p);
    const op_time* t = measured_.find(o.name, p);
    op_time r = t && t->forward_ms >= 0 && t->backward_ms >= 0 ? *t : roofline(o, p);
    if (t && t->forward_ms >= 0) r.forward_ms = t->forward_ms;
    if (t && t->backward_ms >= 0) r.backward_ms = t->backward_ms;
    if (!o.has_backward) r.backward_ms = 0.0;
    return r;
  }

  /// Host time to issue `o`'s forward and backward at `p` (the CPU chain): the measured
  /// value when there is one, one kernel launch (`launch_ms`) otherwise; none for the
  /// backward of an op without one.
  op_time host_time(const op& o, precision p) const {
    const op_time* t = measured_.find_host(o.name, clamp_precision(o.kind, p));
    return {t && t->forward_ms >= 0 ? t->forward_ms : dev_.launch_ms, !o.has_backward ? 0.0
                                                                      : t && t->backward_ms >= 0
                                                                          ? t->backward_ms
                                                                          : dev_.launch_ms};
  }

  /// True when `o`'s forward (or backward) GPU time at `p` was measured. A profile at a
  /// low precision runs under autocast, whose casts of the fp32 weights and of fp32
  /// graph inputs run inside the op (and the weight gradient's cast back inside its
  /// backward or the profile's tail), so the measurement already holds them.
  bool measured_with_casts(const op& o, precision p, bool backward) const {
    const op_time* t = measured_.find(o.name, clamp_precision(o.kind, p));
    return t && (backward ? t->backward_ms : t->forward_ms) >= 0;
  }

  /// The iteration's tail for a plan where `p` holds most parameters: the tail measured
  /// at `p`, else at the measured precision nearest it in rank, else the roofline
  /// optimizer step (`optimizer_ms`) with no host time beyond one launch.
  tail_time tail(precision p, double params, double state_bytes_per_param) const {
    if (const auto q = tail_source(p)) {
      const tail_time* best = measured_.find_tail(*q);
      return {best->gpu_ms, std::max(0.0, best->cpu_ms)};
    }
    return {optimizer_ms(params, state_bytes_per_param), 0.0};
  }

  /// The profiled precision whose tail (and code between the ops) a plan at ambient `p`
  /// takes: `p` when measured, else the measured one nearest in rank; none without a
  /// measured tail.
  std::optional<precision> tail_source(precision p) const {
    std::optional<precision> best;
    int dist = precision_count;
    for (precision q : all_precisions) {
      const tail_time* t = measured_.find_tail(q);
      const int d = std::abs(index_of(q) - index_of(p));
      if (t && t->gpu_ms >= 0 && d < dist) best = q, dist = d;
    }
    return best;
  }

  /// GPU time of the code between the ops that runs before `o`'s forward and backward,
  /// from the profile at `p` (see tail_source); zero where none was measured.
  op_time code_time(const op& o, precision p) const {
    const op_time* t = measured_.find_code(o.name, p);
    return t ? *t : op_time{0.0, 0.0};
  }

  /// Roofline estimate: max(FLOPs / peak, bytes / bandwidth), with fp32 bytes scaled by
  /// the precision's storage width. Backward is two GEMMs (data and weight gradients)
  /// for ops with parameters and one pass otherwise, over twice the traffic.
  op_time roofline(const op& o, precision p) const {
    LOWBIT_EXPECTS(dev_.supports(p), "device '" + dev_.name + "' has no " + to_string(p) +
                                         " mode (op '" + o.name + "')");
    const double bytes = o.bytes * storage_bits(p) / 32.0;
    const double fwd = std::max(o.flops / dev_.flops_per_ms(p), bytes / dev_.bytes_per_ms());
    // The input's gradient, plus the weights' for the share of them that trains.
    const double bwd_flops =
        o.flops * (1.0 + (o.has_params() ? o.trainable_numel() / o.param_numel : 0.0));
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

/// Bytes an iteration holds at its peak: what each category allocates over the step, less
/// what of it is not live at the peak (`released`: backward frees an op's saved tensors as it
/// allocates the gradients, so the two are never all held together).
struct memory_breakdown {
  double weights = 0.0;        ///< fp32 master weights
  double gradients = 0.0;      ///< fp32 gradients
  double optimizer = 0.0;      ///< optimizer state
  double activations = 0.0;    ///< saved activations at each op's precision
  double weight_copies = 0.0;  ///< autocast's low-precision weight copies, saved for backward
  double cast_copies = 0.0;    ///< edge casts' outputs saved for backward (cast_saves_copy)
  double workspace = 0.0;      ///< library workspace, gradients and scratch in flight at the peak
  double released = 0.0;       ///< of the above, what is freed or not yet allocated at the peak
  /// The peak, bytes.
  double total() const noexcept {
    return weights + gradients + optimizer + activations + weight_copies + cast_copies + workspace -
           released;
  }
};

/// True for kinds whose weights autocast copies to the low precision (convolutions,
/// linears and unknown ops); norms keep fp32 weights and embeddings are not cast.
constexpr bool copies_weights(op_kind k) noexcept {
  return k != op_kind::batch_norm && k != op_kind::layer_norm && k != op_kind::embedding;
}

/// True for kinds that keep their input for backward (a GEMM for its weight gradient, a
/// norm for its statistics' gradient).
constexpr bool saves_input(op_kind k) noexcept {
  return k == op_kind::conv || k == op_kind::linear || k == op_kind::matmul ||
         k == op_kind::batch_norm || k == op_kind::layer_norm;
}

/// Bytes op `o`, at `p`, saves of a cast of an input of `input_numel` elements when its
/// producer runs at another storage width: a uniform profile records each saved storage
/// once, for the first op that saves it, so a conv after a ReLU (which keeps its output)
/// records nothing for its input there. Once a cast sits on that edge the two no longer
/// share: the producer keeps its output and the consumer the cast's, a storage the
/// profile never saw. The profile shared it exactly when the op keeps its input
/// (saves_input) and recorded less than that input at its width; otherwise the input is
/// in its saved bytes already (at its width) and nothing is added.
inline double cast_saves_copy(const op& o, precision p, double saved, double input_numel) {
  const double bytes = input_numel * storage_bits(p) / 8.0;
  return saves_input(o.kind) && saved < bytes ? bytes : 0.0;
}

/// Bytes the measured saved activations over-count under lowbit's plan applier with
/// ambient precision `ambient`. Autocast casts an activation that arrives at another
/// width once per consumer, so a uniform 16-bit profile records a copy for each
/// consumer of, say, a layer norm's fp32 output (q, k and v: three; op::input_cast_bytes).
/// The applier hands the ops at the ambient precision one copy, cast to the ambient, of
/// the output of a producer that runs at another precision: the ops at the ambient that
/// it feeds directly (not through code between the ops) share that copy, which counts
/// once, the largest of their recorded casts. A producer at the ambient (the uniform
/// plan: the norm's autocast output stays fp32) keeps autocast's copy per consumer.
inline double shared_input_casts(const op_graph& g, const std::vector<precision>& per_op,
                                 precision ambient) {
  std::vector<double> sum(g.size(), 0.0), largest(g.size(), 0.0);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const op& o = g.at(i);
    const precision p = clamp_precision(o.kind, per_op[i]);
    const double c = o.input_cast_bytes[index_of(p)];
    if (p != ambient || !(c > 0)) continue;
    for (std::size_t j : g.producers(i)) {
      if (g.via_code(i, j) || clamp_precision(g.at(j).kind, per_op[j]) == ambient) continue;
      sum[j] += c;
      largest[j] = std::max(largest[j], c);
      break;
    }
  }
  double over = 0.0;
  for (std::size_t j = 0; j < g.size(); ++j) over += sum[j] - largest[j];
  return over;
}

/// Memory of one iteration with op `i` at `per_op[i]`: weights in fp32 (the ops' and the
/// `unused_param_numel` no op takes), gradients in fp32 and optimizer state for the
/// parameters that get gradients (op::trainable_numel), and each op's saved activations: the size
/// measured at its precision when the model has one, else its storage width (bits/32 of the fp32
/// size, 16-bit-floor kinds clamped to 16 bits). Autocast keeps a copy of the weights of every
/// low-precision conv or linear (copies_weights) at that width until backward has used
/// it (one copy a width of weights several calls share, op::weights_from). An edge cast
/// whose output the consumer saves where the profile shared the input adds
/// that output (cast_saves_copy; one input per op, two for a matmul). The peak is found by
/// walking backward (ops in reverse, gradients set to None before the step, as
/// zero_grad(set_to_none=True) leaves them, and a fused optimizer): at op i the weights,
/// the optimizer state and `workspace_mib` are held, with the weight gradients of op i and
/// every op after it (weights several calls share: from the first of their backwards, each
/// later call's contribution in flight during its own), what op i and the ops before it
/// saved (the later ops' backward has freed theirs), and op i's incoming and outgoing
/// gradient (twice its output at its width) and measured transient bytes
/// (op::workspace_bytes); just before op i (its weight gradient not yet allocated), the
/// same with the transient of the backward of the code right after op i instead
/// (op::code_workspace_bytes, at the ambient where measured there: a language model's loss); after
/// the last op, the weights, the state and every gradient (the optimizer step). The largest of
/// those is the peak; an op's forward scratch is taken at the same point (the activations saved
/// after it in forward are those freed before it in backward). With `ambient` (the
/// cast_rule::ambient of lowbit's plan applier) an input through code between the ops
/// (op::via_code) arrives at the ambient precision, whatever its producer ran at: it is a copy only
/// where the op runs at another width than the ambient one; what that code saved after an op
/// (op::code_saved_bytes) is taken at the ambient precision; and autocast's per-consumer casts of
/// an input, which the applier makes one shared copy, count once (shared_input_casts).
inline memory_breakdown memory_bytes(const op_graph& g, const std::vector<precision>& per_op,
                                     double optimizer_bytes_per_param, double workspace_mib = 0.0,
                                     std::optional<precision> ambient = std::nullopt,
                                     double unused_param_numel = 0.0) {
  LOWBIT_EXPECTS(per_op.size() == g.size(), "one precision per op is needed");
  memory_breakdown m;
  const double trainable = g.trainable_params();
  m.weights = 4.0 * (g.total_params() + unused_param_numel);
  m.gradients = 4.0 * trainable;
  m.optimizer = optimizer_bytes_per_param * trainable;
  // Per op, in backward's order: what it frees after its backward, what it holds in flight
  // during it, what the code after it holds in flight just before it, and its weight
  // gradient.
  struct held {
    double saved, in_flight, code_in_flight, gradient;
  };
  std::vector<held> walk;
  const auto& order = g.topo_order();
  // Autocast's copy of weights shared by several calls (a module called twice, a head
  // tied to its embedding) is made once a width, by the first call in forward order that
  // copies (autocast caches the cast of a parameter for the step), and held until that
  // call's backward, the last of theirs: it counts there.
  std::vector<double> copies(g.size(), 0.0);
  std::set<std::pair<std::size_t, int>> copied;  // (holder, storage bits)
  for (std::size_t i : order) {
    const op& o = g.at(i);
    const precision p = clamp_precision(o.kind, per_op[i]);
    const auto holder = g.weights_holder(i);
    if (holder && storage_bits(p) < 32 && copies_weights(o.kind) &&
        copied.insert({*holder, storage_bits(p)}).second)
      copies[i] = g.at(*holder).param_numel * storage_bits(p) / 8.0;
  }
  // Each call of shared weights adds its gradient into the holder's: the first backward
  // of the group (its last call) allocates the gradient, each later one holds its own
  // contribution in flight while autograd adds it in place.
  std::set<std::size_t> has_gradient;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const op& o = g.at(*it);
    const precision p = clamp_precision(o.kind, per_op[*it]);
    const double width = storage_bits(p) / 8.0;
    const double measured = o.saved_bytes[index_of(p)];
    double saved = measured >= 0 ? measured : o.saved_numel * width;
    if (ambient && measured >= 0 && o.saved_bytes[index_of(*ambient)] >= 0) {
      // What code between the ops saved after this op: at the ambient precision it runs
      // at under the applier, from the ambient profile.
      const auto code = [&](precision q) { return std::max(0.0, o.code_saved_bytes[index_of(q)]); };
      saved += code(*ambient) - code(p);
    }
    const double copy = copies[*it];
    const auto holder = g.weights_holder(*it);
    const double gradient = holder ? 4.0 * g.at(*holder).trainable_numel() : 0.0;
    const bool first_of_group = holder && has_gradient.insert(*holder).second;
    // One saved input per op (a matmul's two are both activations): the largest input
    // that arrives at another width, so that producers seen through the code between
    // modules (q, k and v behind attention, feeding o) count as the one input they make.
    double casts = 0, other = 0;
    for (std::size_t j : g.producers(*it)) {
      const precision from =
          ambient && g.via_code(*it, j) ? *ambient : clamp_precision(g.at(j).kind, per_op[j]);
      if (storage_bits(from) == storage_bits(p)) continue;
      const double c = cast_saves_copy(o, p, saved, g.at(j).output_numel);
      if (o.kind == op_kind::matmul) {
        casts += c;
      } else {
        other = std::max(other, c);
      }
    }
    casts += other;
    m.activations += saved;
    m.weight_copies += copy;
    m.cast_copies += casts;
    const double scratch = std::max(0.0, o.workspace_bytes[index_of(p)]);
    // The code after the op runs at the ambient under the applier, as it saves.
    const precision code_at =
        ambient && o.code_workspace_bytes[index_of(*ambient)] >= 0 ? *ambient : p;
    const double code_scratch = std::max(0.0, o.code_workspace_bytes[index_of(code_at)]);
    walk.push_back({saved + copy + casts,
                    2.0 * o.output_numel * width + scratch + (first_of_group ? 0.0 : gradient),
                    code_scratch, first_of_group ? gradient : 0.0});
  }
  if (ambient) m.activations -= shared_input_casts(g, per_op, *ambient);
  const double saved_total = m.activations + m.weight_copies + m.cast_copies;
  // The largest live set (gradients + saved + in flight) and its in-flight part.
  double peak = m.gradients, peak_in_flight = 0.0, gradients = 0.0, freed = 0.0;
  for (const held& h : walk) {
    const double kept = std::max(0.0, saved_total - freed);
    if (gradients + kept + h.code_in_flight > peak)  // before the op's weight gradient
      peak = gradients + kept + h.code_in_flight, peak_in_flight = h.code_in_flight;
    gradients += h.gradient;
    const double live = gradients + kept + h.in_flight;
    if (live > peak) peak = live, peak_in_flight = h.in_flight;
    freed += h.saved;
  }
  m.workspace = workspace_mib * 1024.0 * 1024.0 + peak_in_flight;
  m.released = m.gradients + saved_total + peak_in_flight - peak;
  return m;
}

}  // namespace lowbit::qsync
