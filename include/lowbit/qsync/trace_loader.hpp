// Reads measured per-op GPU times from a PyTorch-profiler Chrome trace.
#pragma once

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#if defined(LOWBIT_QSYNC_WITH_ZLIB)
#include <zlib.h>
#endif

#include "lowbit/core/error.hpp"
#include "lowbit/qsync/cost_model.hpp"
#include "lowbit/qsync/op_graph.hpp"
#include "lowbit/qsync/precision.hpp"

namespace lowbit::qsync {

/// Suffix of the range that times an op's backward: an op `N` is timed by ranges named
/// `N` (forward) and `N.backward`, e.g. `torch.profiler.record_function(N)` around the
/// module call and around its backward hook.
inline constexpr const char* backward_suffix = ".backward";

namespace detail {
// Splits a range name into the op it times and whether it is the backward half.
inline std::pair<std::string, bool> op_of_range(const std::string& name) {
  const std::string suffix = backward_suffix;
  const bool bwd = name.size() > suffix.size() &&
                   name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  return {bwd ? name.substr(0, name.size() - suffix.size()) : name, bwd};
}
}  // namespace detail

/// Per-range GPU times found in a trace, averaged over occurrences (iterations), ms.
struct trace_ranges {
  std::map<std::string, double> gpu_ms;
  std::map<std::string, int> occurrences;
  /// All kernel time per iteration (per ProfilerStep#N range, or per occurrence of the
  /// most frequent range where the trace has none), ms: with the ops' ranges it gives the
  /// kernels no op launched (optimizer step, gradient accumulation), see tail_ms().
  double kernel_ms = 0;
  /// Kernels per range and per iteration, averaged over occurrences (0 without kernel
  /// events).
  std::map<std::string, double> kernels;
  double kernels_per_iteration = 0;
  /// The device's own gap between two kernels, ms: the median, over the idle spells of a
  /// device that end with a kernel launched before the spell began (so the kernel waited
  /// for the GPU, not for the host), of the spell's length (up to 20 us). 0 where no kernel
  /// was queued. On one H200 with torch 2.11 it is 1.2-1.4 us. Every kernel pays it, also where the
  /// host keeps ahead; busy_ms() adds it to a range's kernel time.
  double dispatch_gap_ms = 0;
  /// The GPU time range `name` keeps its stream busy per occurrence: its kernels' time
  /// plus a dispatch gap each, ms.
  double busy_ms(const std::string& name) const {
    const auto k = kernels.find(name);
    return gpu_ms.at(name) + (k == kernels.end() ? 0.0 : k->second * dispatch_gap_ms);
  }
  /// The code between the ops, by the op range it precedes (filled where read_trace_ranges
  /// is given the op graph): the kernel time per occurrence of the kernels launched outside
  /// every range, on any thread, after the previous op range began and before range `name`
  /// (the first op range of the iteration to start after their launch), and how many. The
  /// host time of that code is already the following range's (cpu_ms counts the gap before
  /// a range), so its kernels are priced with it, at that point of the iteration, and not
  /// after the last op as a tail: a residual add, attention's core written as functions, a
  /// loss computed in the forward run while the host issues the ops around them. Kernels
  /// after the iteration's last op range (the optimizer step) and those inside ranges that
  /// are not ops stay in the tail.
  std::map<std::string, double> code_gpu_ms;
  std::map<std::string, double> code_kernels;
  /// The GPU time the code before range `name` keeps its stream busy per occurrence: its
  /// kernels' time plus a dispatch gap each, ms (0 where none).
  double code_busy_ms(const std::string& name) const {
    const auto g = code_gpu_ms.find(name);
    if (g == code_gpu_ms.end()) return 0.0;
    const auto k = code_kernels.find(name);
    return g->second + (k == code_kernels.end() ? 0.0 : k->second * dispatch_gap_ms);
  }
  /// Host time per occurrence of a range, ms: from the end of the previous range on the
  /// same thread in the same iteration (or the iteration's start on its own thread, or the
  /// thread's first event in the iteration on another, e.g. autograd's) to the range's
  /// end, less the time spent in synchronising runtime calls. Gaps count so that Python
  /// between ops is host time of the op that follows it. Averaged over the range's
  /// occurrences in an iteration, then the median over the iterations
  /// (detail::median_of): a stall of the host (a descheduled thread, a collection) lands
  /// in one iteration's range and only adds; a mean over the iterations hands a share of
  /// it to that op (profile three or more iterations).
  std::map<std::string, double> cpu_ms;
  /// Host time per iteration (ProfilerStep#N duration less synchronising calls on any
  /// thread), ms, the median over the iterations; negative where the trace has no
  /// ProfilerStep ranges.
  double host_ms = -1;
  /// Iterations seen (ProfilerStep ranges, else the most frequent range's count).
  int iterations = 0;
  /// The host's two phases per iteration, ms, less synchronising calls, each the median
  /// over the iterations (-1 where the trace does not show them): forward, from
  /// the iteration's start to its first backward range (`N.backward`), and backward,
  /// from there to the end of its last one; in a trace of
  /// host times timed without a profiler, its `qsync.forward` and `qsync.backward`
  /// ranges (qsync_model.host_trace). add_profile takes each phase's instrumentation
  /// excess off that phase's ranges: where the host spends its time decides when the GPU
  /// can run.
  double forward_host_ms = -1, backward_host_ms = -1;
};

/// The names of the host phases in a trace timed without a profiler (trace_ranges).
inline constexpr const char* forward_phase = "qsync.forward";
inline constexpr const char* backward_phase = "qsync.backward";

namespace detail {
// True for runtime calls in which the host waits for the GPU.
inline bool is_sync_call(const std::string& name) {
  return name.find("Synchronize") != std::string::npos ||
         (name.rfind("cudaMemcpy", 0) == 0 && name.find("Async") == std::string::npos);
}
/// The median idle spell (us) of a device, over its spells whose closing kernel's launch
/// call had returned before the spell began (trace_ranges::dispatch_gap_ms). Spells over
/// 20 us are left out: a queued kernel that waits that long waited for something else (a
/// copy, which is not a kernel event, or another stream's event).
template <class Devices>
double dispatch_gap_us(Devices& devices, const std::map<long long, double>& launch_end) {
  std::vector<double> gaps;
  for (auto& [device, list] : devices) {
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.ts < b.ts; });
    double busy_until = list.empty() ? 0.0 : list[0].ts + list[0].dur;  // every stream's work
    for (std::size_t i = 1; i < list.size(); ++i) {
      const auto launched = launch_end.find(list[i].correlation);
      const double idle = list[i].ts - busy_until;
      if (idle >= 0 && idle <= 20 && launched != launch_end.end() && launched->second < busy_until)
        gaps.push_back(idle);
      busy_until = std::max(busy_until, list[i].ts + list[i].dur);
    }
  }
  if (gaps.empty()) return 0.0;
  const auto mid = gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2);
  std::nth_element(gaps.begin(), mid, gaps.end());
  return *mid;
}

// Seconds of [a, b] covered by the spans in `spans` (sorted by start, non-overlapping).
inline double covered(const std::vector<std::pair<double, double>>& spans, double a, double b) {
  double s = 0;
  for (const auto& [ts, dur] : spans) s += std::max(0.0, std::min(b, ts + dur) - std::max(a, ts));
  return s;
}
}  // namespace detail

namespace detail {
/// A user range on one host thread (microseconds).
struct host_range {
  std::string name;
  double ts, dur;
  std::string thread;
};

// The median of `v` (not empty; the mean of the two middle values for an even count).
// Host times of profiled iterations are skewed upwards only (the host stalls, it never
// runs ahead of itself): from three iterations on, one stalled iteration does not move
// it; of two it is their mean.
inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Fills out.forward_host_ms and out.backward_host_ms (see trace_ranges): the medians over
// the steps (sorted by start) that show both phases, `ranges` sorted by start, less
// what `waited(a, b)` says the host spent in synchronising calls in [a, b].
template <class Waited>
void read_phases(const std::vector<const host_range*>& steps,
                 const std::vector<const host_range*>& ranges, Waited waited, trace_ranges& out) {
  std::vector<double> fwd, bwd;
  for (const host_range* s : steps) {
    const double s1 = s->ts + s->dur;
    double named_f = -1, named_b = -1, first = -1, last = -1;
    for (const host_range* r : ranges) {
      if (r->ts < s->ts || r->ts > s1) continue;
      if (r->name == forward_phase) named_f = r->dur - waited(r->ts, r->ts + r->dur);
      if (r->name == backward_phase) named_b = r->dur - waited(r->ts, r->ts + r->dur);
      if (op_of_range(r->name).second) {
        if (first < 0) first = r->ts;
        last = std::max(last, r->ts + r->dur);
      }
    }
    if (named_f >= 0 && named_b >= 0) {
      fwd.push_back(named_f);
      bwd.push_back(named_b);
    } else if (first >= 0) {
      fwd.push_back((first - s->ts) - waited(s->ts, first));
      bwd.push_back((last - first) - waited(first, last));
    }
  }
  if (!fwd.empty()) {
    out.forward_host_ms = median_of(fwd) / 1000.0;
    out.backward_host_ms = median_of(bwd) / 1000.0;
  }
}

// Fills out.cpu_ms and out.host_ms (see trace_ranges) from the user ranges, the
// synchronising calls and the host events of every thread.
inline void read_host_times(const std::vector<host_range>& ranges,
                            std::map<std::string, std::vector<std::pair<double, double>>>& syncs,
                            std::map<std::string, std::vector<double>>& activity,
                            trace_ranges& out) {
  for (auto& [t, v] : syncs) std::sort(v.begin(), v.end());
  for (auto& [t, v] : activity) std::sort(v.begin(), v.end());
  auto waited = [&](const std::string& thread, double a, double b) {
    auto it = syncs.find(thread);
    return it == syncs.end() ? 0.0 : covered(it->second, a, b);
  };
  std::vector<const host_range*> steps, ops;
  for (const auto& r : ranges) (r.name.rfind("ProfilerStep#", 0) == 0 ? steps : ops).push_back(&r);
  auto by_start = [](const host_range* a, const host_range* b) { return a->ts < b->ts; };
  std::sort(steps.begin(), steps.end(), by_start);
  std::sort(ops.begin(), ops.end(), by_start);
  // Time in synchronising calls on any thread within [a, b] (the main thread waits for
  // autograd's without a CUDA call, so the threads' work is counted once).
  auto waited_anywhere = [&](double a, double b) {
    double w = 0;
    for (const auto& [thread, v] : syncs) w += covered(v, a, b);
    return w;
  };
  if (!steps.empty()) {
    std::vector<double> h;
    for (const host_range* s : steps) h.push_back(s->dur - waited_anywhere(s->ts, s->ts + s->dur));
    out.host_ms = median_of(h) / 1000.0;
  }
  read_phases(steps, ops, waited_anywhere, out);
  // name -> step (nullptr: outside every step) -> (host us, occurrences)
  std::map<std::string, std::map<const host_range*, std::pair<double, int>>> per_step;
  std::map<std::string, std::pair<const host_range*, double>> last;  // thread -> (step, end)
  for (const host_range* r : ops) {
    const host_range* step = nullptr;
    for (const host_range* s : steps)
      if (s->ts <= r->ts && r->ts <= s->ts + s->dur) step = s;
    // A range nested in the previous one (or the first of its thread in this
    // iteration on a thread without the step) counts its own span only.
    double from = r->ts;
    auto l = last.find(r->thread);
    if (l != last.end() && l->second.first == step && l->second.second <= r->ts) {
      from = l->second.second;
    } else if (step && step->thread == r->thread && (l == last.end() || l->second.first != step)) {
      from = step->ts;
    } else if (step && (l == last.end() || l->second.first != step)) {
      const auto& v = activity[r->thread];
      auto first = std::lower_bound(v.begin(), v.end(), step->ts);
      if (first != v.end()) from = std::min(r->ts, *first);
    }
    const double end = r->ts + r->dur;
    auto& at = per_step[r->name][step];
    at.first += (end - from) - waited(r->thread, from, end);
    ++at.second;
    if (l == last.end() || l->second.first != step || l->second.second <= end)
      last[r->thread] = {step, end};
  }
  for (const auto& [name, steps_of] : per_step) {
    std::vector<double> means;
    for (const auto& [step, at] : steps_of) means.push_back(at.first / at.second);
    out.cpu_ms[name] = median_of(means) / 1000.0;
  }
}
}  // namespace detail

namespace detail {
/// Fills out.code_gpu_ms and out.code_kernels (see trace_ranges): every launch (a thread's
/// (ts, correlation), sorted) of kernels outside every user range of its thread other than
/// the ProfilerStep ranges goes to the first range of an op of `graph` that starts after it
/// (any thread) within the same ProfilerStep; none there, it stays in the tail.
template <class Launches, class Kernels>
void attribute_code(const std::vector<host_range>& ranges, const Launches& launches,
                    const Kernels& kernels, const op_graph& graph, trace_ranges& out) {
  std::vector<std::pair<double, double>> steps;                         // (start, end)
  std::map<std::string, std::vector<std::pair<double, double>>> spans;  // thread -> ranges
  std::vector<std::pair<double, const std::string*>> ops;               // (start, name)
  for (const auto& r : ranges) {
    if (r.name.rfind("ProfilerStep#", 0) == 0) {
      steps.push_back({r.ts, r.ts + r.dur});
      continue;
    }
    spans[r.thread].push_back({r.ts, r.ts + r.dur});
    if (graph.find(op_of_range(r.name).first)) ops.push_back({r.ts, &r.name});
  }
  std::sort(steps.begin(), steps.end());
  std::sort(ops.begin(), ops.end());
  std::map<std::string, double> us, n;
  for (const auto& [thread, list] : launches) {
    auto& mine = spans[thread];
    std::sort(mine.begin(), mine.end());
    std::vector<double> reach(mine.size());  // the latest end of the ranges up to each
    for (std::size_t i = 0; i < mine.size(); ++i)
      reach[i] = std::max(mine[i].second, i ? reach[i - 1] : mine[i].second);
    for (const auto& [ts, c] : list) {
      const auto k = kernels.find(c);
      if (k == kernels.end()) continue;
      const auto before =
          std::upper_bound(mine.begin(), mine.end(), std::pair<double, double>{ts, 1e300}) -
          mine.begin();
      if (before > 0 && reach[static_cast<std::size_t>(before - 1)] >= ts) continue;  // inside
      double limit = 1e300;
      if (!steps.empty()) {
        auto s = std::upper_bound(steps.begin(), steps.end(), std::pair<double, double>{ts, 1e300});
        if (s == steps.begin() || std::prev(s)->second < ts) continue;  // outside every step
        limit = std::prev(s)->second;
      }
      const auto next = std::lower_bound(ops.begin(), ops.end(),
                                         std::pair<double, const std::string*>{ts, nullptr});
      if (next == ops.end() || next->first > limit) continue;  // after the last op: the tail
      us[*next->second] += k->second.us;
      n[*next->second] += k->second.n;
    }
  }
  for (const auto& [name, t] : us) {
    const double occ = std::max(1, out.occurrences[name]);
    out.code_gpu_ms[name] = t / 1000.0 / occ;
    out.code_kernels[name] = n[name] / occ;
  }
}
}  // namespace detail

/// Reads the GPU and host time of every user range of a Chrome trace (`{"traceEvents": [...]}`
/// or a bare event array). Where the trace has kernels (`cat` "kernel") with
/// `args.correlation`, a range's time is the sum of the kernels whose launching runtime
/// call (`cat` "cuda_runtime" or "cuda_driver", same correlation) lies inside a
/// `user_annotation` range on the same thread: kernel time only, so idle gaps between
/// kernels (a host-bound range) do not count, every stream's kernels count once, and a
/// range that launched nothing is 0. Kernels launched outside every range make `tail_ms`.
/// Only a trace without such kernels falls back to its `gpu_user_annotation` spans,
/// averaged over occurrences (one per `args.External id`: a range whose kernels ran on
/// several streams has one span per stream). Microseconds become milliseconds; several
/// occurrences of a name are averaged. Host times per range and per iteration are read
/// as described at trace_ranges::cpu_ms and host_ms.
///
/// Given the op graph, the kernels launched outside every range are also attributed to
/// the op range that follows them (trace_ranges::code_gpu_ms): the code between the ops.
inline trace_ranges read_trace_ranges(const nlohmann::json& trace,
                                      const op_graph* graph = nullptr) {
  const nlohmann::json* events = &trace;
  if (trace.is_object()) {
    LOWBIT_EXPECTS(trace.contains("traceEvents"), "malformed trace: no \"traceEvents\" array");
    events = &trace["traceEvents"];
  }
  LOWBIT_EXPECTS(events->is_array(), "malformed trace: \"traceEvents\" is not an array");
  std::vector<detail::host_range> cpu_ranges;
  struct gpu_span {
    double dur;
    long long external;  ///< args["External id"], -1 when absent
  };
  std::map<std::string, std::vector<gpu_span>> gpu_ranges;
  // Launches per thread as (ts, correlation), sorted below so that each range finds its
  // launches by binary search: real traces hold 1e5 launches and 1e3 ranges.
  std::map<std::string, std::vector<std::pair<double, long long>>> launches;
  struct launched_kernels {
    double us = 0;  ///< summed kernel time
    int n = 0;      ///< kernels
  };
  std::map<long long, launched_kernels> kernels;  // correlation -> its kernels
  std::map<long long, double> launch_end;         // correlation -> end of its runtime call
  struct kernel_event {
    double ts, dur;
    long long correlation;
  };
  std::map<std::string, std::vector<kernel_event>> devices;             // device -> kernels
  std::map<std::string, std::vector<std::pair<double, double>>> syncs;  // thread -> (ts, dur)
  std::map<std::string, std::vector<double>> activity;  // thread -> host event starts
  for (std::size_t n = 0; n < events->size(); ++n) {
    const auto& e = (*events)[n];
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    try {
      const std::string cat = e.value("cat", "");
      const std::string thread =
          e.contains("pid") ? e["pid"].dump() + "/" + e.value("tid", nlohmann::json()).dump() : "";
      const double ts = e.at("ts").get<double>(), dur = e.at("dur").get<double>();
      const auto correlation = [&]() -> long long {
        if (!e.contains("args") || !e["args"].contains("correlation")) return -1;
        return e["args"]["correlation"].get<long long>();
      };
      if (cat == "cpu_op" || cat == "cuda_runtime" || cat == "cuda_driver")
        activity[thread].push_back(ts);
      if ((cat == "cuda_runtime" || cat == "cuda_driver") &&
          detail::is_sync_call(e.value("name", "")))
        syncs[thread].push_back({ts, dur});
      if (cat == "gpu_user_annotation") {
        long long external = -1;
        if (e.contains("args") && e["args"].contains("External id"))
          external = e["args"]["External id"].get<long long>();
        gpu_ranges[e.at("name").get<std::string>()].push_back({dur, external});
      } else if (cat == "user_annotation") {
        cpu_ranges.push_back({e.at("name").get<std::string>(), ts, dur, thread});
      } else if (cat == "cuda_runtime" || cat == "cuda_driver") {
        if (long long c = correlation(); c >= 0) {
          launches[thread].push_back({ts, c});
          launch_end[c] = ts + dur;
        }
      } else if (cat == "kernel") {
        if (long long c = correlation(); c >= 0) {
          kernels[c].us += dur;
          ++kernels[c].n;
          devices[e.contains("pid") ? e["pid"].dump() : ""].push_back({ts, dur, c});
        }
      }
    } catch (const nlohmann::json::exception& ex) {
      LOWBIT_EXPECTS(false, "malformed trace event #" + std::to_string(n) + ": " + ex.what());
    }
  }
  trace_ranges out;
  if (kernels.empty() && !gpu_ranges.empty()) {
    for (const auto& [name, spans] : gpu_ranges) {
      double s = 0;
      std::vector<long long> ids;
      for (const gpu_span& g : spans) {
        s += g.dur;
        if (g.external >= 0) ids.push_back(g.external);
      }
      std::sort(ids.begin(), ids.end());
      const auto distinct = std::unique(ids.begin(), ids.end()) - ids.begin();
      // One occurrence per External id; spans without one count one each.
      const int n = static_cast<int>(distinct) +
                    static_cast<int>(spans.size() - static_cast<std::size_t>(ids.size()));
      out.gpu_ms[name] = s / 1000.0 / static_cast<double>(n);
      out.occurrences[name] = n;
    }
    detail::read_host_times(cpu_ranges, syncs, activity, out);
    return out;
  }
  for (auto& [thread, list] : launches) std::sort(list.begin(), list.end());
  std::map<std::string, double> sum, count;
  int steps = 0;  // the profiler's own ProfilerStep#N ranges: one per iteration
  for (const auto& r : cpu_ranges) {
    steps += r.name.rfind("ProfilerStep#", 0) == 0 ? 1 : 0;
    double s = 0, n = 0;
    auto it = launches.find(r.thread);
    if (it != launches.end()) {
      const auto& list = it->second;
      auto at = std::lower_bound(list.begin(), list.end(), std::pair<double, long long>{r.ts, -1});
      for (; at != list.end() && at->first <= r.ts + r.dur; ++at) {
        auto k = kernels.find(at->second);
        if (k == kernels.end()) continue;
        s += k->second.us;
        n += k->second.n;
      }
    }
    sum[r.name] += s;
    count[r.name] += n;
    ++out.occurrences[r.name];
  }
  int iterations = steps;
  for (const auto& [name, s] : sum) {
    out.gpu_ms[name] = s / 1000.0 / out.occurrences[name];
    out.kernels[name] = count[name] / out.occurrences[name];
    if (steps == 0) iterations = std::max(iterations, out.occurrences[name]);
  }
  double total = 0, n = 0;
  for (const auto& [c, k] : kernels) {
    total += k.us;
    n += k.n;
  }
  out.kernel_ms = total / 1000.0 / std::max(iterations, 1);
  out.kernels_per_iteration = n / std::max(iterations, 1);
  out.dispatch_gap_ms = detail::dispatch_gap_us(devices, launch_end) / 1000.0;
  out.iterations = iterations;
  if (graph) detail::attribute_code(cpu_ranges, launches, kernels, *graph, out);
  read_host_times(cpu_ranges, syncs, activity, out);
  return out;
}

/// Measured op times at `p` (the precision the profiled run used) from a trace's
/// ranges: forward from `N`, backward from `N.backward`, each its kernels' time plus a
/// dispatch gap per kernel (trace_ranges::busy_ms). A missing half is stored as
/// -1 so the cost model fills it from the roofline. Ranges that are not ops of `graph`
/// (profiler steps, optimizer) are skipped and listed in `*skipped` when given.
inline measured_table measured_from_trace(const nlohmann::json& trace, precision p,
                                          const op_graph& graph,
                                          std::vector<std::string>* skipped = nullptr,
                                          measured_table table = {}) {
  const trace_ranges r = read_trace_ranges(trace, &graph);
  std::map<std::string, op_time> found, code;
  for (const auto& [name, ms] : r.gpu_ms) {
    const auto [base, bwd] = detail::op_of_range(name);
    if (!graph.find(base)) {
      if (skipped) skipped->push_back(name);
      continue;
    }
    auto it = found.emplace(base, op_time{-1.0, -1.0}).first;
    (bwd ? it->second.backward_ms : it->second.forward_ms) = r.busy_ms(name);
    auto c = code.emplace(base, op_time{0.0, 0.0}).first;
    (bwd ? c->second.backward_ms : c->second.forward_ms) = r.code_busy_ms(name);
  }
  for (const auto& [name, t] : found) table.set(name, p, t);
  for (const auto& [name, t] : code) table.set_code(name, p, t);
  return table;
}

/// GPU time per iteration (kernels and their dispatch gaps) that no op of `graph`
/// launched (the optimizer step, gradient accumulation, casts outside every op) and that
/// is not the code between the ops attributed to the range after it (code_gpu_ms, where
/// `r` was read with the graph), ms: what a replay of the ops and that code leaves out.
/// Assumes the ops' ranges do not nest.
inline double tail_ms(const trace_ranges& r, const op_graph& graph) {
  double ops = 0;
  for (const auto& [name, ms] : r.gpu_ms)
    if (graph.find(detail::op_of_range(name).first))
      ops += (r.busy_ms(name) + r.code_busy_ms(name)) * r.occurrences.at(name);
  ops /= std::max(r.iterations, 1);
  return std::max(0.0, r.kernel_ms + r.kernels_per_iteration * r.dispatch_gap_ms - ops);
}

namespace detail {
// The per-range overhead c with sum_i w_i max(0, x_i - c) = target (0 <= target <=
// sum w_i x_i): every range loses the same instrumentation cost, none below zero.
inline double water_level(const std::vector<std::pair<double, double>>& xw, double target) {
  auto left = [&](double c) {
    double s = 0;
    for (const auto& [x, w] : xw) s += w * std::max(0.0, x - c);
    return s;
  };
  double lo = 0, hi = 0;
  for (const auto& [x, w] : xw) hi = std::max(hi, x);
  for (int k = 0; k < 200 && hi - lo > 1e-12 * std::max(1.0, hi); ++k) {
    const double mid = 0.5 * (lo + hi);
    (left(mid) > target ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}
}  // namespace detail

/// Adds one profile at precision `p` to `table`: every op's GPU time (as
/// measured_from_trace), its host time, and the iteration's tail (kernels no op launched,
/// host time outside every op). The instrumented trace's ranges inflate host time (each
/// range adds its hooks and record_function calls), so when `plain` is given, a trace of
/// the same loop without ranges (or one holding only ProfilerStep ranges of host times
/// measured without a profiler), its host time per iteration `H_plain` is the truth and
/// the excess `E = H_instr - H_plain` is taken off the op ranges as one cost per range,
/// `c` with `sum max(0, x_i - c) = sum x_i - E`, none below 0; the tail keeps its
/// measured host time. When E exceeds all op ranges' host time, ops get 0 and the tail
/// `H_plain`; when E < 0 (noise), op times stay and the tail is what is left of
/// `H_plain` (never below 0). Where both traces show the host's phases
/// (trace_ranges::forward_host_ms), each phase's excess is taken off its own ranges in
/// the same way (the forward's ranges and the backward's), so that the host keeps the
/// split between them it has without a profiler. Op and tail host times then add up to
/// `H_plain`. Returns the names of ranges that are not ops of `graph`.
inline std::vector<std::string> add_profile(measured_table& table, const nlohmann::json& trace,
                                            precision p, const op_graph& graph,
                                            const nlohmann::json* plain = nullptr) {
  std::vector<std::string> skipped;
  table = measured_from_trace(trace, p, graph, &skipped, std::move(table));
  const trace_ranges r = read_trace_ranges(trace, &graph);
  const double iterations = std::max(r.iterations, 1);
  // The op ranges' host times (and per-iteration counts), forward [0] and backward [1].
  std::vector<std::pair<double, double>> xw[2];
  double ops_host[2] = {0, 0};
  for (const auto& [name, ms] : r.cpu_ms)
    if (const auto [base, bwd] = detail::op_of_range(name); graph.find(base)) {
      xw[bwd].push_back({ms, r.occurrences.at(name) / iterations});
      ops_host[bwd] += ms * xw[bwd].back().second;
    }
  double overhead[2] = {0, 0};
  double tail_host = r.host_ms >= 0 ? std::max(0.0, r.host_ms - ops_host[0] - ops_host[1]) : -1.0;
  if (plain) {
    const trace_ranges q = read_trace_ranges(*plain);
    LOWBIT_EXPECTS(q.host_ms >= 0, "the un-instrumented trace has no ProfilerStep ranges");
    // Excess `e` taken off ranges holding `ops` ms: their cost each, and what they keep.
    const auto take = [](const std::vector<std::pair<double, double>>& x, double ops, double e,
                         double& cost) {
      if (e >= ops) {
        cost = std::numeric_limits<double>::infinity();
        return 0.0;
      }
      cost = e > 0 ? detail::water_level(x, ops - e) : 0.0;
      return e > 0 ? ops - e : ops;
    };
    double kept = 0;
    if (q.forward_host_ms >= 0 && r.forward_host_ms >= 0 && r.host_ms >= 0) {
      // Each phase loses its own excess: the profiler's cost per range differs between the
      // forward (Python module calls) and the backward (autograd's thread).
      kept += take(xw[0], ops_host[0], r.forward_host_ms - q.forward_host_ms, overhead[0]);
      kept += take(xw[1], ops_host[1], r.backward_host_ms - q.backward_host_ms, overhead[1]);
    } else {
      std::vector<std::pair<double, double>> all = xw[0];
      all.insert(all.end(), xw[1].begin(), xw[1].end());
      kept = take(all, ops_host[0] + ops_host[1], r.host_ms >= 0 ? r.host_ms - q.host_ms : 0.0,
                  overhead[0]);
      overhead[1] = overhead[0];
    }
    tail_host = std::max(0.0, q.host_ms - kept);
  }
  std::map<std::string, op_time> found;
  for (const auto& [name, ms] : r.cpu_ms) {
    const auto [base, bwd] = detail::op_of_range(name);
    if (!graph.find(base)) continue;
    auto it = found.emplace(base, op_time{-1.0, -1.0}).first;
    (bwd ? it->second.backward_ms : it->second.forward_ms) = std::max(0.0, ms - overhead[bwd]);
  }
  for (const auto& [name, t] : found) table.set_host(name, p, t);
  table.set_tail(p, {tail_ms(r, graph), tail_host});
  return skipped;
}

/// The bytes of a file; a `.gz` file is decompressed when the including code defines
/// LOWBIT_QSYNC_WITH_ZLIB and links zlib (profiler traces are large and PyTorch writes
/// them gzipped when asked), else reading one is an error that says so.
inline std::string read_file_text(const std::string& path) {
  const bool gz = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  if (gz) {
#if defined(LOWBIT_QSYNC_WITH_ZLIB)
    gzFile f = gzopen(path.c_str(), "rb");
    LOWBIT_EXPECTS(f != nullptr, "cannot open '" + path + "'");
    std::string out;
    std::vector<char> buf(1 << 16);
    int n = 0;
    while ((n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0)
      out.append(buf.data(), static_cast<std::size_t>(n));
    int code = 0;
    const std::string why = n < 0 ? gzerror(f, &code) : "";
    gzclose(f);
    LOWBIT_EXPECTS(n == 0, "cannot decompress '" + path + "': " + why);
    return out;
#else
    LOWBIT_EXPECTS(false, "'" + path +
                              "' is gzipped: this build reads .gz only with zlib "
                              "(LOWBIT_QSYNC_WITH_ZLIB); gunzip it first");
#endif
  }
  std::ifstream in(path, std::ios::binary);
  LOWBIT_EXPECTS(in.good(), "cannot open '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Parses a JSON file (gzipped too, see read_file_text); throws invalid_argument naming
/// the file (and the byte where the JSON breaks) when it cannot be read or parsed.
inline nlohmann::json read_json_file(const std::string& path) {
  const std::string text = read_file_text(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    LOWBIT_EXPECTS(false, "malformed JSON in '" + path + "' at byte " + std::to_string(e.byte) +
                              ": " + e.what());
  }
  return {};
}

}  // namespace lowbit::qsync
