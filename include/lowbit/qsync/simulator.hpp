// Turns a plan into per-device kernel sequences (with casts where neighbouring
// precisions differ), replays them synchronously and sums memory: the predictor.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "lowbit/core/error.hpp"
#include "lowbit/qsync/cluster.hpp"
#include "lowbit/qsync/comm_model.hpp"
#include "lowbit/qsync/cost_model.hpp"
#include "lowbit/qsync/op_graph.hpp"
#include "lowbit/qsync/plan.hpp"
#include "lowbit/qsync/replayer.hpp"

namespace lowbit::qsync {

/// One device group's side of an evaluation.
struct group_result {
  std::vector<precision> precisions;  ///< per op, followers resolved
  device_trace trace;
  device_timing timing;
  memory_breakdown memory;
  std::vector<double> comm_ms;  ///< per bucket
  bool fits = true;             ///< memory within the device's usable capacity
};

/// What a plan costs: the synchronous iteration time and each group's memory.
struct evaluation {
  std::vector<group_result> groups;
  sync_times times;
  /// True when every group's memory fits.
  bool fits_memory() const noexcept {
    for (const auto& g : groups)
      if (!g.fits) return false;
    return true;
  }
  /// The synchronous iteration time, ms.
  double iteration_ms() const noexcept { return times.iteration_ms; }
};

/// The predictor for one model on one cluster.
class simulator {
 public:
  /// Builds cost models, buckets and each op's precision menu per group; throws
  /// invalid_argument when an op has no precision a device offers.
  simulator(training_model model, cluster hw) : model_(std::move(model)), hw_(std::move(hw)) {
    LOWBIT_EXPECTS(!hw_.groups.empty(), "cluster '" + hw_.name + "' has no devices");
    for (const auto& g : hw_.groups)
      LOWBIT_EXPECTS(g.count >= 1, "device group '" + g.device.name + "' has count < 1");
    LOWBIT_EXPECTS(hw_.link.bandwidth_gbs > 0, "link '" + hw_.link.name + "' has no bandwidth");
    buckets_ = make_buckets(model_.graph, model_.bucket_cap_mb, model_.first_bucket_mb);
    for (const auto& g : hw_.groups) {
      costs_.emplace_back(g.device, g.measured);
      std::vector<std::vector<precision>> menus;
      for (const op& o : model_.graph.ops()) menus.push_back(allowed_precisions(o, g.device));
      menus_.push_back(std::move(menus));
    }
  }

  /// The model.
  const training_model& model() const noexcept { return model_; }
  /// The op graph.
  const op_graph& graph() const noexcept { return model_.graph; }
  /// The cluster.
  const cluster& hardware() const noexcept { return hw_; }
  /// DDP gradient buckets, in the order they become ready.
  const std::vector<grad_bucket>& buckets() const noexcept { return buckets_; }
  /// Number of device groups.
  std::size_t group_count() const noexcept { return hw_.groups.size(); }
  /// Group g's cost model.
  const cost_model& costs(std::size_t g) const { return costs_.at(g); }
  /// Precisions op i may take on group g, ascending.
  const std::vector<precision>& menu(std::size_t g, std::size_t i) const {
    return menus_.at(g).at(i);
  }

  /// Fills in the parameter-free ops of `per_op`: each takes the precision its first input
  /// carries (carried_precision: bf16 behind an fp8 op), moved to the nearest one its menu
  /// allows. One fed by no op (the step's own inputs) runs in the step's context: through
  /// the ambient (lowbit's plan applier), the ambient precision, where the uniform
  /// profiles ran it and the applier leaves it (a uniform plan wraps nothing); per edge
  /// (QSync's rule), fp32. Throws when a parameter op's precision is not in its menu,
  /// naming op and device.
  std::vector<precision> resolve(std::size_t g, std::vector<precision> per_op) const {
    const op_graph& gr = model_.graph;
    LOWBIT_EXPECTS(
        per_op.size() == gr.size(),
        "plan for device group '" + hw_.groups.at(g).device.name + "' needs one precision per op");
    // Only the parameter ops count towards the dominant precision: per_op's are final.
    const precision graph_input = model_.casts == cast_rule::ambient
                                      ? carried_precision(dominant_precision(per_op))
                                      : precision::fp32;
    for (std::size_t i : gr.topo_order()) {
      const op& o = gr.at(i);
      const auto& m = menu(g, i);
      if (o.has_params()) {
        LOWBIT_EXPECTS(std::find(m.begin(), m.end(), per_op[i]) != m.end(),
                       std::string("op '") + o.name + "' cannot run at " + to_string(per_op[i]) +
                           " on " + hw_.groups[g].device.name);
      } else {
        const auto& in = gr.producers(i);
        per_op[i] =
            nearest_allowed(m, in.empty() ? graph_input : carried_precision(per_op[in.front()]));
      }
    }
    return per_op;
  }

  /// Group g's kernels for resolved precisions `p`. Forward in topological order: the
  /// casts of the op's inputs, the cast of the fp32 master weights for low-precision ops
  /// with parameters, the op. Backward in reverse: the casts of the gradients arriving
  /// from its consumers, the op's backward, and the cast of its weight gradient back to
  /// fp32, after which the gradient is ready for its bucket. The casts follow the model's
  /// cast_rule: per_edge, one per edge whose producer runs at another precision than its
  /// consumer (each way); ambient (lowbit's plan applier, at the step's ambient precision
  /// A = dominant_precision): an op at p != A hands the code between the ops its output
  /// cast to A, whether that code reads it or not; an edge that is the producer's own
  /// output costs p[j] -> p[i] unless the consumer is at A (it reads that copy), an edge
  /// through code between the ops costs A -> p[i]; gradients go back the same ways. An op
  /// whose time at its precision was measured gets no weight or graph-input casts: its
  /// autocast profile holds them. Edges carry carried_precision of their ops (an fp8 op
  /// takes and gives bf16 and casts its input and its output gradient to fp8 inside
  /// itself: priced as casts where its time is not measured), and the ambient is
  /// what the dominant precision carries (a plan of mostly fp8 ops steps at bf16); the code
  /// between the ops, the tail and the wrapped ops are those of the dominant precision's
  /// own profile and step. Each op kernel carries the op's host time (measured,
  /// else one launch); an edge cast carries the device's cast host time (forward, or its
  /// gradient's in backward), a weight or graph-input cast one launch. Through the
  /// ambient, every op the applier wraps (wrapped_ops at the ambient) carries the host time
  /// of its hooks on its forward kernel (a function op also its mode_calls, the torch
  /// calls the applier's function mode checks for it) and what it costs in backward
  /// beyond its casts' gradients on its backward kernel, unless its measured time holds
  /// them (an fp8 op: the applier wraps every fp8 op, the uniform fp8 profile's too). The tail is
  /// the one measured at A (else the roofline optimizer step).
  device_trace trace(std::size_t g, const std::vector<precision>& p) const {
    const op_graph& gr = model_.graph;
    const cost_model& cm = costs_.at(g);
    const double launch = cm.device().launch_ms;
    const double edge_host[2] = {cm.device().cast_host_ms(false), cm.device().cast_host_ms(true)};
    device_trace t;
    auto push = [&](double cpu, double gpu, kernel_kind kind, std::size_t i) {
      t.kernels.push_back({cpu, gpu, kind, i});
    };
    // `host`: one launch for autocast's weight and input casts, the cast host time for
    // an edge cast (edge_host[backward]).
    auto cast = [&](precision from, precision to, double numel, std::size_t i, double host) {
      if (from != to && numel > 0 && cm.cast_ms(from, to, numel) > 0)
        push(host, cm.cast_ms(from, to, numel), kernel_kind::cast, i);
    };
    const precision step = dominant_precision(p);
    const precision ambient = carried_precision(step);
    const auto carried = [&](std::size_t i) { return carried_precision(p[i]); };
    const bool through_ambient = model_.casts == cast_rule::ambient;
    // Through the ambient: whether op i's output cast to the ambient precision is read,
    // by code between the ops or directly by an op at the ambient precision. Unread, it is
    // launched and dropped, and has no backward.
    std::vector<bool> ambient_copy_read(gr.size(), false);
    for (std::size_t i = 0; through_ambient && i < gr.size(); ++i)
      for (std::size_t c : gr.consumers(i))
        if (gr.via_code(c, i) || carried(c) == ambient) ambient_copy_read[i] = true;
    // Through the ambient, an op autocast keeps at fp32 (autocast_runs_fp32) takes and
    // gives fp32 at any precision the plan names, and its neighbours' 16-bit profiles hold
    // the casts around it: the applier's casts around it replace those, none are added.
    const auto free_casts = [&](std::size_t i) {
      return through_ambient && autocast_runs_fp32(gr.at(i).kind);
    };
    const auto edge_cast = [&](precision from, precision to, double numel, std::size_t i,
                               std::size_t other, bool backward) {
      if (!free_casts(i) && !free_casts(other)) cast(from, to, numel, i, edge_host[backward]);
    };
    const std::vector<bool> wrapped =
        through_ambient ? wrapped_ops(p, ambient) : std::vector<bool>(gr.size(), false);
    const switch_host_costs& sw = cm.device().switches;
    // An op that does not carry its own precision (fp8) is off the ambient even in its
    // uniform plan, so its profile ran it wrapped: its measured host time holds the hooks
    // (`inside`: its time at p[i] was measured, forward or backward).
    const auto wrap_ms = [&](std::size_t i, bool inside, bool backward) {
      const bool held = inside && carried(i) != p[i];
      if (!wrapped[i] || held) return 0.0;
      return backward ? sw.wrap_backward_ms : sw.wrap_ms + gr.at(i).mode_calls * sw.mode_call_ms;
    };
    // The code between the ops (residual adds, functional attention, a loss), measured
    // before each op in the profile whose tail the plan takes: the code runs at the
    // ambient precision. Its host time is in the op's (cpu 0 here); its kernels run before
    // the op's, where the host issued them, not after the last op.
    const auto code_source = cm.tail_source(step);
    const auto code = [&](std::size_t i) {
      return code_source ? cm.code_time(gr.at(i), *code_source) : op_time{0.0, 0.0};
    };
    for (std::size_t i : gr.topo_order()) {
      const op& o = gr.at(i);
      if (const double c = code(i).forward_ms; c > 0) push(0.0, c, kernel_kind::code, i);
      const bool inside = cm.measured_with_casts(o, p[i], false);
      if (gr.producers(i).empty() && !inside)
        cast(precision::fp32, p[i], o.stats.input_numel, i, launch);
      for (std::size_t j : gr.producers(i)) {
        if (!through_ambient)
          cast(carried(j), carried(i), gr.at(j).output_numel, i, edge_host[0]);
        else if (gr.via_code(i, j))
          edge_cast(ambient, carried(i), gr.at(j).output_numel, i, i, false);
        else if (carried(i) != ambient)  // at the ambient, it reads the producer's ambient copy
          edge_cast(carried(j), carried(i), gr.at(j).output_numel, i, j, false);
      }
      if (o.has_params() && !inside) cast(precision::fp32, p[i], o.param_numel, i, launch);
      // An op that does not carry its own precision (fp8) casts its operands inside
      // itself: priced here where its time is not measured (a measured profile holds it).
      if (!inside && carried(i) != p[i] && !gr.producers(i).empty()) {
        double in = 0;
        for (std::size_t j : gr.producers(i)) in += gr.at(j).output_numel;
        cast(carried(i), p[i], in, i, launch);
      }
      push(cm.host_time(o, p[i]).forward_ms + wrap_ms(i, inside, false),
           cm.time(o, p[i]).forward_ms, kernel_kind::forward, i);
      if (through_ambient) edge_cast(carried(i), ambient, o.output_numel, i, i, false);
    }
    std::vector<std::size_t> grad_ready(gr.size(), no_index);
    const auto& order = gr.topo_order();
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      const std::size_t i = *it;
      const op& o = gr.at(i);
      if (const double c = code(i).backward_ms; c > 0) push(0.0, c, kernel_kind::code, i);
      for (std::size_t c : gr.consumers(i)) {
        if (!through_ambient)
          cast(carried(c), carried(i), o.output_numel, i, edge_host[1]);
        else if (gr.via_code(c, i))
          edge_cast(carried(c), ambient, o.output_numel, i, c, true);
        else if (carried(c) != ambient)
          edge_cast(carried(c), carried(i), o.output_numel, i, c, true);
      }
      if (ambient_copy_read[i]) edge_cast(ambient, carried(i), o.output_numel, i, i, true);
      if (carried(i) != p[i] && o.has_backward && !cm.measured_with_casts(o, p[i], true))
        cast(carried(i), p[i], o.output_numel, i, launch);  // its output gradient, inside it
      // (an op without a backward, an identity or a dropout of p = 0, makes no node: none)
      push(cm.host_time(o, p[i]).backward_ms +
               (o.has_backward ? wrap_ms(i, cm.measured_with_casts(o, p[i], true), true) : 0.0),
           cm.time(o, p[i]).backward_ms, kernel_kind::backward, i);
      if (o.has_params() && !cm.measured_with_casts(o, p[i], true))
        cast(p[i], precision::fp32, o.trainable_numel(), i, launch);
      grad_ready[i] = t.kernels.size() - 1;
    }
    for (const auto& b : buckets_) {
      std::size_t last = 0;
      for (std::size_t i : b.ops) last = std::max(last, grad_ready[i]);
      t.bucket_ready.push_back(last);
    }
    const tail_time tail = cm.tail(step, gr.trainable_params(), model_.optimizer_bytes_per_param);
    t.tail_ms = tail.gpu_ms;
    t.tail_cpu_ms = tail.cpu_ms;
    return t;
  }

  /// The ops lowbit's plan applier wraps under resolved precisions `p` at ambient
  /// precision `ambient` (apply_plan.py: qsync_model.ops_to_wrap and the parameter-free
  /// ops off the ambient): every op at another precision than the ambient, and every op
  /// with parameters fed by an op at another precision than its own. Each carries forward
  /// hooks (a pre- and a post-hook, autocast entered and left, its inputs and outputs
  /// walked); a uniform plan wraps nothing, but for fp8 (its ambient is bf16).
  std::vector<bool> wrapped_ops(const std::vector<precision>& p, precision ambient) const {
    const op_graph& gr = model_.graph;
    std::vector<bool> out(gr.size(), false);
    for (std::size_t i = 0; i < gr.size(); ++i) {
      out[i] = p.at(i) != ambient;
      if (gr.at(i).has_params())
        for (std::size_t j : gr.producers(i)) out[i] = out[i] || p.at(j) != p[i];
    }
    return out;
  }

  /// The precision most ops with parameters run at under `p` (ties to the higher one;
  /// fp32 for a model without parameters): the profile whose tail a plan inherits. It is
  /// the plan applier's ambient precision (examples/pytorch/qsync: the step runs under it
  /// and the code between modules, attention's core among it, at it), counted in ops and
  /// not in parameters, so that a large embedding does not decide what that code runs at.
  precision dominant_precision(const std::vector<precision>& p) const {
    std::array<std::size_t, precision_count> ops{};
    for (std::size_t i = 0; i < graph().size(); ++i)
      if (graph().at(i).has_params()) ++ops[index_of(clamp_precision(graph().at(i).kind, p.at(i)))];
    precision best = precision::fp32;
    for (precision q : all_precisions)
      if (ops[index_of(q)] > 0 && ops[index_of(q)] >= ops[index_of(best)]) best = q;
    return best;
  }

  /// Group g's time for bucket k's all-reduce at `bits` (hierarchical: overlapped on an NCCL
  /// cluster, in turn on an MPI one; flat: the cluster's calibration table where it has
  /// one, which counts the lookups it leaves to the analytic model).
  double bucket_ms(std::size_t g, std::size_t k, int bits) const {
    if (hw_.hierarchical())
      return hierarchical_all_reduce_ms(
          bits, buckets_.at(k).numel, hw_.world_size() / hw_.ranks_per_node, hw_.ranks_per_node,
          hw_.link, hw_.inter_link, costs_.at(g).device(), 32, hw_.schedule, hw_.backend);
    if (hw_.calibration)
      return hw_.calibration
          ->all_reduce(bits, buckets_.at(k).numel, hw_.world_size(), hw_.link,
                       costs_.at(g).device())
          .ms;
    return all_reduce_ms(bits, buckets_.at(k).numel, hw_.world_size(), hw_.link,
                         costs_.at(g).device());
  }

  /// Everything about group g under its part of a plan (the allocator re-runs only the
  /// group it changed).
  group_result run_group(std::size_t g, const std::vector<precision>& per_op,
                         const std::vector<int>& bits) const {
    LOWBIT_EXPECTS(bits.size() == buckets_.size(),
                   "plan needs one bit-width per bucket (" + std::to_string(buckets_.size()) + ")");
    group_result r;
    r.precisions = resolve(g, per_op);
    r.trace = trace(g, r.precisions);
    r.timing = timing_of(r.trace, replay_streams(r.trace.kernels));
    r.memory = memory_bytes(model_.graph, r.precisions, model_.optimizer_bytes_per_param,
                            costs_[g].device().workspace_mib,
                            model_.casts == cast_rule::ambient
                                ? std::optional<precision>(dominant_precision(r.precisions))
                                : std::nullopt,
                            model_.unused_param_numel);
    r.fits = r.memory.total() <= costs_[g].device().usable_bytes();
    for (std::size_t k = 0; k < buckets_.size(); ++k) r.comm_ms.push_back(bucket_ms(g, k, bits[k]));
    return r;
  }

  /// Synchronous replay of already-run groups.
  static sync_times combine(const std::vector<group_result>& groups) {
    std::vector<device_timing> timings;
    std::vector<std::vector<double>> comm;
    for (const auto& r : groups) {
      timings.push_back(r.timing);
      comm.push_back(r.comm_ms);
    }
    return replay_sync(timings, comm);
  }

  /// Predicts a whole plan.
  evaluation evaluate(const plan& pl) const {
    LOWBIT_EXPECTS(pl.precisions.size() == group_count(),
                   "plan needs one precision list per device group");
    evaluation e;
    for (std::size_t g = 0; g < group_count(); ++g)
      e.groups.push_back(run_group(g, pl.precisions[g], pl.bucket_bits));
    e.times = combine(e.groups);
    return e;
  }

  /// Every op at the allowed precision nearest `p` on every group, every bucket at `bits`.
  plan uniform(precision p, int bits = 32) const {
    plan pl;
    for (std::size_t g = 0; g < group_count(); ++g) {
      std::vector<precision> v(graph().size());
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = nearest_allowed(menu(g, i), p);
      pl.precisions.push_back(resolve(g, std::move(v)));
    }
    pl.bucket_bits.assign(buckets_.size(), bits);
    return pl;
  }

 private:
  training_model model_;
  cluster hw_;
  std::vector<grad_bucket> buckets_;
  std::vector<cost_model> costs_;
  std::vector<std::vector<std::vector<precision>>> menus_;
};

}  // namespace lowbit::qsync
