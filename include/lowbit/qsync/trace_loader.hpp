// Reads measured per-op GPU times from a PyTorch-profiler Chrome trace.
#pragma once

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "lowbit/core/error.hpp"
#include "lowbit/qsync/cost_model.hpp"
#include "lowbit/qsync/op_graph.hpp"
#include "lowbit/qsync/precision.hpp"

namespace lowbit::qsync {

/// Suffix of the range that times an op's backward: an op `N` is timed by ranges named
/// `N` (forward) and `N.backward`, e.g. `torch.profiler.record_function(N)` around the
/// module call and around its backward hook.
inline constexpr const char* backward_suffix = ".backward";

/// Per-range GPU times found in a trace, averaged over occurrences (iterations), ms.
struct trace_ranges {
  std::map<std::string, double> gpu_ms;
  std::map<std::string, int> occurrences;
  /// All kernel time per iteration (per ProfilerStep#N range, or per occurrence of the
  /// most frequent range where the trace has none), ms: with the ops' ranges it gives the
  /// kernels no op launched (optimizer step, gradient accumulation), see tail_ms().
  double kernel_ms = 0;
};

/// Reads the GPU time of every user range of a Chrome trace (`{"traceEvents": [...]}`
/// or a bare event array). Where the trace has kernels (`cat` "kernel") with
/// `args.correlation`, a range's time is the sum of the kernels whose launching runtime
/// call (`cat` "cuda_runtime" or "cuda_driver", same correlation) lies inside a
/// `user_annotation` range on the same thread: kernel time only, so idle gaps between
/// kernels (a host-bound range) do not count, every stream's kernels count once, and a
/// range that launched nothing is 0. Kernels launched outside every range make `tail_ms`.
/// Only a trace without such kernels falls back to its `gpu_user_annotation` spans,
/// averaged over occurrences (one per `args.External id`: a range whose kernels ran on
/// several streams has one span per stream). Microseconds become milliseconds; several
/// occurrences of a name are averaged.
inline trace_ranges read_trace_ranges(const nlohmann::json& trace) {
  const nlohmann::json* events = &trace;
  if (trace.is_object()) {
    LOWBIT_EXPECTS(trace.contains("traceEvents"), "malformed trace: no \"traceEvents\" array");
    events = &trace["traceEvents"];
  }
  LOWBIT_EXPECTS(events->is_array(), "malformed trace: \"traceEvents\" is not an array");
  struct range {
    std::string name;
    double ts, dur;
    std::string thread;
  };
  std::vector<range> cpu_ranges;
  struct gpu_span {
    double dur;
    long long external;  ///< args["External id"], -1 when absent
  };
  std::map<std::string, std::vector<gpu_span>> gpu_ranges;
  // Launches per thread as (ts, correlation), sorted below so that each range finds its
  // launches by binary search: real traces hold 1e5 launches and 1e3 ranges.
  std::map<std::string, std::vector<std::pair<double, long long>>> launches;
  std::map<long long, double> kernels;  // correlation -> summed kernel time
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
      if (cat == "gpu_user_annotation") {
        long long external = -1;
        if (e.contains("args") && e["args"].contains("External id"))
          external = e["args"]["External id"].get<long long>();
        gpu_ranges[e.at("name").get<std::string>()].push_back({dur, external});
      } else if (cat == "user_annotation") {
        cpu_ranges.push_back({e.at("name").get<std::string>(), ts, dur, thread});
      } else if (cat == "cuda_runtime" || cat == "cuda_driver") {
        if (long long c = correlation(); c >= 0) launches[thread].push_back({ts, c});
      } else if (cat == "kernel") {
        if (long long c = correlation(); c >= 0) kernels[c] += dur;
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
    return out;
  }
  for (auto& [thread, list] : launches) std::sort(list.begin(), list.end());
  std::map<std::string, double> sum;
  int steps = 0;  // the profiler's own ProfilerStep#N ranges: one per iteration
  for (const auto& r : cpu_ranges) {
    steps += r.name.rfind("ProfilerStep#", 0) == 0 ? 1 : 0;
    double s = 0;
    auto it = launches.find(r.thread);
    if (it != launches.end()) {
      const auto& list = it->second;
      auto at = std::lower_bound(list.begin(), list.end(), std::pair<double, long long>{r.ts, -1});
      for (; at != list.end() && at->first <= r.ts + r.dur; ++at) {
        auto k = kernels.find(at->second);
        if (k != kernels.end()) s += k->second;
      }
    }
    sum[r.name] += s;
    ++out.occurrences[r.name];
  }
  int iterations = steps;
  for (const auto& [name, s] : sum) {
    out.gpu_ms[name] = s / 1000.0 / out.occurrences[name];
    if (steps == 0) iterations = std::max(iterations, out.occurrences[name]);
  }
  double total = 0;
  for (const auto& [c, d] : kernels) total += d;
  out.kernel_ms = total / 1000.0 / std::max(iterations, 1);
  return out;
}

/// Measured op times at `p` (the precision the profiled run used) from a trace's
/// ranges: forward from `N`, backward from `N.backward`. A missing half is stored as
/// -1 so the cost model fills it from the roofline. Ranges that are not ops of `graph`
/// (profiler steps, optimizer) are skipped and listed in `*skipped` when given.
inline measured_table measured_from_trace(const nlohmann::json& trace, precision p,
                                          const op_graph& graph,
                                          std::vector<std::string>* skipped = nullptr,
                                          measured_table table = {}) {
  const trace_ranges r = read_trace_ranges(trace);
  std::map<std::string, op_time> found;
  const std::string suffix = backward_suffix;
  for (const auto& [name, ms] : r.gpu_ms) {
    const bool bwd = name.size() > suffix.size() &&
                     name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    const std::string base = bwd ? name.substr(0, name.size() - suffix.size()) : name;
    if (!graph.find(base)) {
      if (skipped) skipped->push_back(name);
      continue;
    }
    auto it = found.emplace(base, op_time{-1.0, -1.0}).first;
    (bwd ? it->second.backward_ms : it->second.forward_ms) = ms;
  }
  for (const auto& [name, t] : found) table.set(name, p, t);
  return table;
}

/// Kernel time per iteration that no op of `graph` launched (the optimizer step,
/// gradient accumulation, casts outside every op), ms: what a replay of the ops alone
/// leaves out. Assumes the ops' ranges do not nest.
inline double tail_ms(const trace_ranges& r, const op_graph& graph) {
  const std::string suffix = backward_suffix;
  double ops = 0;
  for (const auto& [name, ms] : r.gpu_ms) {
    const bool bwd = name.size() > suffix.size() &&
                     name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    if (graph.find(bwd ? name.substr(0, name.size() - suffix.size()) : name)) ops += ms;
  }
  return std::max(0.0, r.kernel_ms - ops);
}

/// Parses a JSON file; throws invalid_argument naming the file (and the byte where the
/// JSON breaks) when it cannot be read or parsed.
inline nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  LOWBIT_EXPECTS(in.good(), "cannot open '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    LOWBIT_EXPECTS(false, "malformed JSON in '" + path + "' at byte " + std::to_string(e.byte) +
                              ": " + e.what());
  }
  return {};
}

}  // namespace lowbit::qsync
