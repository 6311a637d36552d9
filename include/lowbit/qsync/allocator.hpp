// Chooses a precision per op on each device group and a bit-width per gradient
// bucket, minimising the indicator under an iteration-time target and each device's
// memory: QSync's greedy (corrected) and an exact branch and bound for small instances.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "lowbit/core/error.hpp"
#include "lowbit/qsync/indicator.hpp"
#include "lowbit/qsync/plan.hpp"
#include "lowbit/qsync/simulator.hpp"

namespace lowbit::qsync {

/// The objective: a score per (group, op, precision) and per (bucket, bit-width).
struct score_table {
  /// ops[g][i][index_of(p)]; only parameter ops count.
  std::vector<std::vector<std::array<double, precision_count>>> ops;
  /// buckets[k][j]: bucket k at the j-th entry of the problem's comm_bits.
  std::vector<std::vector<double>> buckets;
};

/// Indicator scores for `sim`: each group's op scores weighted by its share of the ranks
/// (the all-reduce averages every rank's gradient, so a group's perturbation counts in
/// proportion to its size), and the buckets' codec variance scores.
inline score_table indicator_scores(const simulator& sim, const std::vector<int>& comm_bits,
                                    double gamma = default_gamma) {
  score_table t;
  const auto base = op_scores(sim.graph(), gamma);
  const double world = sim.hardware().world_size();
  for (const auto& grp : sim.hardware().groups) {
    auto s = base;
    for (auto& row : s)
      for (double& v : row) v *= grp.count / world;
    t.ops.push_back(std::move(s));
  }
  for (const auto& b : sim.buckets()) {
    const bucket_stats st = estimate_bucket_stats(sim.graph(), b.ops);
    std::vector<double> row;
    for (int bits : comm_bits) row.push_back(comm_score(st, bits));
    t.buckets.push_back(std::move(row));
  }
  return t;
}

/// What the allocator returns.
struct allocation {
  plan result;
  evaluation eval;
  double score = 0.0;           ///< the objective at `result`
  double target_ms = 0.0;       ///< the iteration-time target it worked under
  bool target_met = false;      ///< false when even the fastest start misses the target
  std::size_t evaluations = 0;  ///< plans predicted on the way
};

/// An allocation instance: variables, their options and the objective. A choice is an
/// option index per variable: first every group's parameter ops (group-major, op index
/// order), then every bucket.
class allocation_problem {
 public:
  /// One decision: a parameter op on a group, or a bucket.
  struct variable {
    std::size_t group = 0;  ///< for ops
    std::size_t index = 0;  ///< op index, or bucket index
    bool bucket = false;
    std::vector<double> scores;  ///< per option
  };

  /// `comm_bits` ascending; `target_ms` the iteration-time bound. `sim` must outlive
  /// the problem (it is borrowed, not copied).
  allocation_problem(const simulator& sim, score_table scores, std::vector<int> comm_bits,
                     double target_ms)
      : sim_(&sim), scores_(std::move(scores)), bits_(std::move(comm_bits)), target_(target_ms) {
    LOWBIT_EXPECTS(!bits_.empty(), "at least one communication bit-width is needed");
    LOWBIT_EXPECTS(std::is_sorted(bits_.begin(), bits_.end()), "comm_bits must be ascending");
    for (int b : bits_) (void)wire_bytes(b, 1);  // validates the widths
    LOWBIT_EXPECTS(
        scores_.ops.size() == sim.group_count() && scores_.buckets.size() == sim.buckets().size(),
        "score table does not match the simulator");
    for (std::size_t g = 0; g < sim.group_count(); ++g)
      for (std::size_t i = 0; i < sim.graph().size(); ++i) {
        if (!sim.graph().at(i).has_params()) continue;
        variable v{g, i, false, {}};
        for (precision p : sim.menu(g, i)) v.scores.push_back(scores_.ops[g][i][index_of(p)]);
        vars_.push_back(std::move(v));
      }
    for (std::size_t k = 0; k < sim.buckets().size(); ++k) {
      LOWBIT_EXPECTS(scores_.buckets[k].size() == bits_.size(), "bucket score row size");
      vars_.push_back({0, k, true, scores_.buckets[k]});
    }
  }

  /// The simulator.
  const simulator& sim() const noexcept { return *sim_; }
  /// The decisions.
  const std::vector<variable>& variables() const noexcept { return vars_; }
  /// The candidate bit-widths.
  const std::vector<int>& comm_bits() const noexcept { return bits_; }
  /// The iteration-time target, ms.
  double target_ms() const noexcept { return target_; }

  /// The plan a choice stands for (parameter-free ops resolved).
  plan to_plan(const std::vector<std::size_t>& choice) const {
    LOWBIT_EXPECTS(choice.size() == vars_.size(), "one option per variable is needed");
    plan pl;
    pl.precisions.assign(sim_->group_count(),
                         std::vector<precision>(sim_->graph().size(), precision::fp32));
    pl.bucket_bits.assign(sim_->buckets().size(), 32);
    for (std::size_t v = 0; v < vars_.size(); ++v) {
      const variable& x = vars_[v];
      if (x.bucket)
        pl.bucket_bits[x.index] = bits_.at(choice[v]);
      else
        pl.precisions[x.group][x.index] = sim_->menu(x.group, x.index).at(choice[v]);
    }
    for (std::size_t g = 0; g < sim_->group_count(); ++g)
      pl.precisions[g] = sim_->resolve(g, std::move(pl.precisions[g]));
    return pl;
  }

  /// The objective of a choice.
  double score(const std::vector<std::size_t>& choice) const {
    double s = 0;
    for (std::size_t v = 0; v < vars_.size(); ++v) s += vars_[v].scores.at(choice[v]);
    return s;
  }

  /// True when a predicted plan meets the target and fits every device.
  bool feasible(const evaluation& e) const {
    return e.fits_memory() && e.iteration_ms() <= target_ * (1.0 + 1e-12);
  }

 private:
  const simulator* sim_;
  score_table scores_;
  std::vector<int> bits_;
  double target_;
  std::vector<variable> vars_;
};

namespace detail {

// Names the first group that does not fit, with the numbers, as the tool reports it.
inline void expect_memory_fits(const simulator& sim, const evaluation& e, const char* what) {
  for (std::size_t g = 0; g < e.groups.size(); ++g) {
    const auto& dev = sim.costs(g).device();
    constexpr double gib = 1024.0 * 1024.0 * 1024.0;
    char numbers[96];
    std::snprintf(numbers, sizeof numbers, " needs %.2f GiB, %.2f GiB usable",
                  e.groups[g].memory.total() / gib, dev.usable_bytes() / gib);
    LOWBIT_EXPECTS(e.groups[g].fits, "infeasible memory on " + dev.name + ": " + what + numbers);
  }
}

// Re-predicts only what a change touched: the changed group's kernels, or the comm
// times of the changed bucket.
class incremental_eval {
 public:
  incremental_eval(const allocation_problem& pb, const std::vector<std::size_t>& choice)
      : pb_(pb), plan_(pb.to_plan(choice)) {
    e_ = pb.sim().evaluate(plan_);
  }
  const evaluation& current() const noexcept { return e_; }
  const plan& current_plan() const noexcept { return plan_; }
  std::size_t count() const noexcept { return count_; }

  // Applies option `opt` of variable `v` and re-predicts.
  void set(std::size_t v, std::size_t opt) {
    const auto& x = pb_.variables()[v];
    const simulator& sim = pb_.sim();
    if (x.bucket) {
      plan_.bucket_bits[x.index] = pb_.comm_bits()[opt];
      for (std::size_t g = 0; g < sim.group_count(); ++g)
        e_.groups[g].comm_ms[x.index] = sim.bucket_ms(g, x.index, plan_.bucket_bits[x.index]);
    } else {
      plan_.precisions[x.group][x.index] = sim.menu(x.group, x.index)[opt];
      e_.groups[x.group] = sim.run_group(x.group, plan_.precisions[x.group], plan_.bucket_bits);
      plan_.precisions[x.group] = e_.groups[x.group].precisions;
    }
    e_.times = simulator::combine(e_.groups);
    ++count_;
  }

 private:
  const allocation_problem& pb_;
  plan plan_;
  evaluation e_;
  std::size_t count_ = 1;
};

}  // namespace detail

/// The fastest uniform plan with every bucket at `bits`: of the plans that put every op
/// at one precision (its nearest allowed), the one predicted fastest, lowest precision
/// on ties. Not always the lowest: casts around 16-bit-floor ops can make int8 slower
/// than fp16, which is why the greedy starts here rather than at the lowest precision.
inline plan fastest_uniform_plan(const simulator& sim, int bits) {
  plan best;
  double best_ms = std::numeric_limits<double>::infinity();
  for (precision p : all_precisions) {
    plan pl = sim.uniform(p, bits);
    const double ms = sim.evaluate(pl).iteration_ms();
    if (ms < best_ms) {
      best_ms = ms;
      best = std::move(pl);
    }
  }
  return best;
}

/// The default iteration-time target: the fastest group's full-precision compute time
/// without communication (what the fast devices would do alone), but never below the
/// fastest uniform plan's time (lowest bits on every bucket), so that a target exists.
inline double default_target_ms(const simulator& sim, const std::vector<int>& comm_bits) {
  LOWBIT_EXPECTS(!comm_bits.empty(), "at least one communication bit-width is needed");
  const plan full = sim.uniform(precision::fp32, 32);
  double ideal = std::numeric_limits<double>::infinity();
  for (std::size_t g = 0; g < sim.group_count(); ++g) {
    const group_result r = sim.run_group(g, full.precisions[g], full.bucket_bits);
    ideal = std::min(ideal, std::max(r.timing.compute_end, r.timing.cpu_end) + r.timing.tail_ms);
  }
  const double fastest = sim.evaluate(fastest_uniform_plan(sim, comm_bits.front())).iteration_ms();
  return std::max(ideal, fastest);
}

/// The target a user on one device usually means: "the most ops at high precision (the
/// lowest indicator) that still run within `slack` of the fastest plan", i.e. the
/// fastest uniform plan's predicted time (every bucket at `bits`) times (1 + slack), e.g.
/// 0.05 for 5%. Slack must be >= 0; with 0 the allocator keeps only the promotions that
/// cost no time at all.
inline double slack_target_ms(const simulator& sim, int bits, double slack) {
  LOWBIT_EXPECTS(slack >= 0, "the slack over the fastest uniform plan must be >= 0, got " +
                                 std::to_string(slack));
  return sim.evaluate(fastest_uniform_plan(sim, bits)).iteration_ms() * (1.0 + slack);
}

/// The target a Hopper user asks for: "keep `fraction` of the fastest plan's speed-up over
/// uniform `reference`" (e.g. 0.8 of fp8's over bf16): the reference plan's predicted time
/// less `fraction` of its gap to the fastest uniform plan (buckets at `bits`). The
/// allocator then finds the plan with the least indicator (the fewest, least sensitive
/// low-precision ops) within that time. `fraction` must lie in [0, 1]; where the
/// reference is itself the fastest the target is its time.
inline double speedup_target_ms(const simulator& sim, int bits, double fraction,
                                precision reference = precision::bf16) {
  LOWBIT_EXPECTS(
      fraction >= 0 && fraction <= 1,
      "the fraction of the speed-up to keep must lie in [0, 1], got " + std::to_string(fraction));
  const double ref = sim.evaluate(sim.uniform(reference, bits)).iteration_ms();
  const double fastest = sim.evaluate(fastest_uniform_plan(sim, bits)).iteration_ms();
  return ref - fraction * std::max(0.0, ref - fastest);
}

/// QSync's greedy allocator, corrected. It starts from the fastest uniform plan with
/// every bucket at the lowest bits (which must fit in memory, else invalid_argument
/// names the device). Each variable climbs a ladder of its options in rank order from
/// there, keeping only options whose score is strictly below the previous rung (a
/// slower option that perturbs no less is never worth it). Each pass ranks every next
/// rung by its score gain, largest first, ties by variable index, and walks that list
/// once, keeping each change whose predicted plan meets the target and fits and
/// reverting each one that does not before trying the next. A memory rejection is final
/// (memory only grows up a ladder); a time rejection is retried in the next pass, since
/// casts make time non-monotone. Passes repeat until one keeps nothing. The result is
/// feasible and never worse than the start.
inline allocation greedy_allocate(const allocation_problem& pb) {
  const auto& vars = pb.variables();
  const plan start = fastest_uniform_plan(pb.sim(), pb.comm_bits().front());
  std::vector<std::size_t> choice(vars.size(), 0);
  for (std::size_t v = 0; v < vars.size(); ++v) {
    if (vars[v].bucket) continue;
    const auto& m = pb.sim().menu(vars[v].group, vars[v].index);
    const precision p = start.precisions[vars[v].group][vars[v].index];
    choice[v] = static_cast<std::size_t>(std::find(m.begin(), m.end(), p) - m.begin());
  }
  std::vector<std::vector<std::size_t>> ladder(vars.size());
  for (std::size_t v = 0; v < vars.size(); ++v) {
    ladder[v].push_back(choice[v]);
    for (std::size_t o = choice[v] + 1; o < vars[v].scores.size(); ++o)
      if (vars[v].scores[o] < vars[v].scores[ladder[v].back()]) ladder[v].push_back(o);
  }
  std::vector<std::size_t> rung(vars.size(), 0);
  detail::incremental_eval ev(pb, choice);
  detail::expect_memory_fits(pb.sim(), ev.current(), "the fastest uniform plan");
  allocation out;
  out.target_ms = pb.target_ms();
  out.target_met = pb.feasible(ev.current());
  if (out.target_met) {
    std::vector<bool> memory_blocked(vars.size(), false);
    std::vector<std::pair<double, std::size_t>> cands;
    for (;;) {
      cands.clear();
      for (std::size_t v = 0; v < vars.size(); ++v)
        if (!memory_blocked[v] && rung[v] + 1 < ladder[v].size())
          cands.push_back(
              {vars[v].scores[ladder[v][rung[v]]] - vars[v].scores[ladder[v][rung[v] + 1]], v});
      std::sort(cands.begin(), cands.end(), [](const auto& a, const auto& b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
      });
      bool accepted = false;
      for (const auto& [gain, v] : cands) {  // one pass, in gain order
        ev.set(v, ladder[v][rung[v] + 1]);
        if (pb.feasible(ev.current())) {
          ++rung[v];
          choice[v] = ladder[v][rung[v]];
          accepted = true;
          continue;
        }
        const auto& x = vars[v];
        if (!x.bucket && !ev.current().groups[x.group].fits) memory_blocked[v] = true;
        ev.set(v, choice[v]);  // revert
      }
      if (!accepted) break;
    }
  }
  out.result = ev.current_plan();
  out.eval = ev.current();
  out.score = pb.score(choice);
  out.evaluations = ev.count();
  return out;
}

/// Exact solver: depth-first branch and bound over every variable's options, best
/// score first. A branch is cut when its score plus the best the remaining variables
/// could add cannot beat the incumbent, or when a memory lower bound (assigned ops at
/// their precision, the rest at their smallest) exceeds a device. Time is checked at
/// the leaves only: casts make it non-monotone in precision, so a partial plan gives no
/// safe bound. Throws invalid_argument when no plan is feasible, when there are more
/// than `max_variables` decisions, or when more than `max_evaluations` leaves would be
/// predicted: it is meant for small instances and for checking the greedy.
inline allocation exact_allocate(const allocation_problem& pb,
                                 std::size_t max_evaluations = 200'000,
                                 std::size_t max_variables = 40) {
  const simulator& sim = pb.sim();
  const op_graph& gr = sim.graph();
  const auto& vars = pb.variables();
  const std::size_t n = vars.size(), groups = sim.group_count();
  LOWBIT_EXPECTS(n <= max_variables,
                 "the exact solver is for small instances: " + std::to_string(n) +
                     " decisions (limit " + std::to_string(max_variables) +
                     "); use the greedy allocator");
  // Options of each variable, best score first (ties by option index).
  std::vector<std::vector<std::size_t>> order(n);
  std::vector<double> suffix(n + 1, 0.0);
  for (std::size_t v = 0; v < n; ++v) {
    order[v].resize(vars[v].scores.size());
    for (std::size_t o = 0; o < order[v].size(); ++o) order[v][o] = o;
    std::stable_sort(order[v].begin(), order[v].end(), [&](std::size_t a, std::size_t b) {
      return vars[v].scores[a] < vars[v].scores[b];
    });
  }
  for (std::size_t v = n; v-- > 0;) suffix[v] = suffix[v + 1] + vars[v].scores[order[v][0]];
  // Memory lower bound per group: fixed part plus every op at its smallest menu entry;
  // assigning an op adds the difference to its chosen entry.
  auto act = [&](std::size_t i, precision p) {
    return gr.at(i).saved_numel * storage_bits(clamp_precision(gr.at(i).kind, p)) / 8.0;
  };
  std::vector<double> mem(groups), cap(groups);
  for (std::size_t g = 0; g < groups; ++g) {
    mem[g] = memory_bytes(gr, std::vector<precision>(gr.size(), precision::fp32),
                          sim.model().optimizer_bytes_per_param, 0.0, std::nullopt,
                          sim.model().unused_param_numel)
                 .total();
    for (std::size_t i = 0; i < gr.size(); ++i)
      mem[g] += act(i, sim.menu(g, i).front()) - act(i, precision::fp32);
    cap[g] = sim.costs(g).device().usable_bytes();
  }
  std::vector<std::size_t> choice(n, 0), best;
  double best_score = std::numeric_limits<double>::infinity();
  std::size_t leaves = 0;
  bool found = false;
  allocation out;
  auto dfs = [&](auto&& self, std::size_t v, double partial) -> void {
    if (partial + suffix[v] >= best_score) return;
    for (std::size_t g = 0; g < groups; ++g)
      if (mem[g] > cap[g]) return;
    if (v == n) {
      LOWBIT_EXPECTS(++leaves <= max_evaluations, "instance too large for the exact solver (over " +
                                                      std::to_string(max_evaluations) +
                                                      " plans); use the greedy allocator");
      const evaluation e = sim.evaluate(pb.to_plan(choice));
      if (pb.feasible(e)) {
        best_score = partial;
        best = choice;
        found = true;
        out.eval = e;
      }
      return;
    }
    const auto& x = vars[v];
    for (std::size_t o : order[v]) {
      choice[v] = o;
      double delta = 0;
      if (!x.bucket)
        delta = act(x.index, sim.menu(x.group, x.index)[o]) -
                act(x.index, sim.menu(x.group, x.index).front());
      if (!x.bucket) mem[x.group] += delta;
      self(self, v + 1, partial + x.scores[o]);
      if (!x.bucket) mem[x.group] -= delta;
    }
    choice[v] = 0;
  };
  dfs(dfs, 0, 0.0);
  LOWBIT_EXPECTS(found, "no plan meets the target of " + std::to_string(pb.target_ms()) +
                            " ms within every device's memory");
  out.result = pb.to_plan(best);
  out.score = best_score;
  out.target_ms = pb.target_ms();
  out.target_met = pb.feasible(out.eval);
  out.evaluations = leaves;
  return out;
}

}  // namespace lowbit::qsync
