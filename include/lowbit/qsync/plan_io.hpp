// JSON in and out: model and cluster descriptions (with measured overrides) for the
// planner, and the plan it writes. Errors name the place in the document.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "lowbit/core/error.hpp"
#include "lowbit/qsync/allocator.hpp"
#include "lowbit/qsync/cluster.hpp"
#include "lowbit/qsync/device_profile.hpp"
#include "lowbit/qsync/op_graph.hpp"
#include "lowbit/qsync/simulator.hpp"
#include "lowbit/qsync/trace_loader.hpp"

namespace lowbit::qsync {

namespace detail {

// Runs `f`, prefixing any JSON type error or lowbit error with `where` (once).
template <class F>
auto at_place(const std::string& where, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const nlohmann::json::exception& e) {
    throw ::lowbit::invalid_argument(__FILE__, __LINE__, where + ": " + e.what());
  } catch (const ::lowbit::invalid_argument& e) {
    const std::string& what = e.message();  // without the file:line
    if (what.compare(0, where.size(), where) == 0) throw;
    throw ::lowbit::invalid_argument(__FILE__, __LINE__, where + ": " + what);
  }
}

inline double number_or(const nlohmann::json& j, const char* key, double fallback) {
  return j.contains(key) ? j.at(key).get<double>() : fallback;
}

inline std::vector<precision> precisions_of(const nlohmann::json& j) {
  std::vector<precision> out;
  for (const auto& x : j) out.push_back(parse_precision(x.get<std::string>()));
  return out;
}

}  // namespace detail

/// A model from JSON:
/// `{"name", "optimizer_bytes_per_param", "bucket_cap_mb", "first_bucket_mb", "casts",
///   "ops": [{"name", "kind", "flops", "bytes", "output_numel", "saved_numel",
///            "param_numel", "inputs": [...], "via_code": [...], "weights_from": [op]
///            (the op whose parameters it runs with, one of its inputs),
///            "allowed": ["fp16", ...],
///            "backward": false (no backward work; default true), "frozen_numel" (of
///            param_numel, those without gradients), "mode_calls" (a function op's torch
///            calls the plan applier's mode checks a step), "stats": {"weight_norm", ...}}],
///   "unused_params": {"numel", "names"} (parameters no op takes)}`.
/// Unknown input ops and cycles are reported by op_graph, naming the op.
inline training_model model_from_json(const nlohmann::json& j) {
  LOWBIT_EXPECTS(j.is_object(), "model JSON: expected an object");
  LOWBIT_EXPECTS(j.contains("ops") && j["ops"].is_array(), "model JSON: no \"ops\" array");
  training_model m;
  detail::at_place("model JSON", [&] {
    m.name = j.value("name", std::string("model"));
    m.optimizer_bytes_per_param = detail::number_or(j, "optimizer_bytes_per_param", 8.0);
    m.bucket_cap_mb = detail::number_or(j, "bucket_cap_mb", 25.0);
    m.first_bucket_mb = detail::number_or(j, "first_bucket_mb", 1.0);
    const std::string casts = j.value("casts", std::string("per_edge"));
    LOWBIT_EXPECTS(casts == "per_edge" || casts == "ambient",
                   "\"casts\" must be \"per_edge\" or \"ambient\", not \"" + casts + "\"");
    m.casts = casts == "ambient" ? cast_rule::ambient : cast_rule::per_edge;
    if (j.contains("unused_params")) {
      m.unused_param_numel = detail::number_or(j["unused_params"], "numel", 0);
      LOWBIT_EXPECTS(m.unused_param_numel >= 0, "\"unused_params\" numel must be >= 0");
    }
  });
  std::vector<op> ops;
  const auto& arr = j["ops"];
  for (std::size_t n = 0; n < arr.size(); ++n) {
    const auto& x = arr[n];
    const std::string where = "model JSON ops[" + std::to_string(n) + "]" +
                              (x.is_object() && x.contains("name") && x["name"].is_string()
                                   ? " ('" + x["name"].get<std::string>() + "')"
                                   : std::string());
    detail::at_place(where, [&] {
      op o;
      o.name = x.at("name").get<std::string>();
      o.kind = parse_op_kind(x.value("kind", std::string("other")));
      o.flops = detail::number_or(x, "flops", 0);
      o.bytes = detail::number_or(x, "bytes", 0);
      o.output_numel = detail::number_or(x, "output_numel", 0);
      o.saved_numel = detail::number_or(x, "saved_numel", 0);
      o.param_numel = detail::number_or(x, "param_numel", 0);
      o.frozen_numel = detail::number_or(x, "frozen_numel", 0);
      if (x.contains("inputs")) o.inputs = x["inputs"].get<std::vector<std::string>>();
      if (x.contains("via_code")) o.via_code = x["via_code"].get<std::vector<std::string>>();
      if (x.contains("weights_from")) {  // export.py writes a list of one name
        const auto& w = x["weights_from"];
        const auto names = w.is_string() ? std::vector<std::string>{w.get<std::string>()}
                                         : w.get<std::vector<std::string>>();
        LOWBIT_EXPECTS(names.size() <= 1, "\"weights_from\" names at most one op");
        if (!names.empty()) o.weights_from = names.front();
      }
      if (x.contains("allowed")) o.allowed = detail::precisions_of(x["allowed"]);
      o.has_backward = x.value("backward", true);
      o.mode_calls = detail::number_or(x, "mode_calls", 0);
      LOWBIT_EXPECTS(o.mode_calls >= 0, "\"mode_calls\" must be >= 0");
      // Measured bytes per precision: {"fp32": B, "bf16": B}.
      const auto per_precision = [&](const char* key, std::array<double, precision_count>& to) {
        if (x.contains(key))
          for (const auto& [pn, v] : x[key].items())
            to[index_of(parse_precision(pn))] = v.get<double>();
      };
      per_precision("saved_bytes", o.saved_bytes);
      per_precision("input_cast_bytes", o.input_cast_bytes);
      per_precision("code_saved_bytes", o.code_saved_bytes);
      per_precision("workspace_bytes", o.workspace_bytes);
      per_precision("code_workspace_bytes", o.code_workspace_bytes);
      if (x.contains("stats")) {
        const auto& s = x["stats"];
        o.stats.weight_norm = detail::number_or(s, "weight_norm", 0);
        o.stats.weight_absmax = detail::number_or(s, "weight_absmax", 0);
        o.stats.input_norm = detail::number_or(s, "input_norm", 0);
        o.stats.input_absmax = detail::number_or(s, "input_absmax", 0);
        o.stats.input_numel = detail::number_or(s, "input_numel", 0);
        o.stats.grad_weight_norm = detail::number_or(s, "grad_weight_norm", 0);
        o.stats.grad_output_absmax = detail::number_or(s, "grad_output_absmax", 0);
        o.stats.grad_output_numel = detail::number_or(s, "grad_output_numel", 0);
      }
      ops.push_back(std::move(o));
    });
  }
  m.graph = op_graph(std::move(ops));
  return m;
}

namespace detail {
inline linear_cost linear_cost_of(const nlohmann::json& j, linear_cost c) {
  c.a_ms = number_or(j, "a_ms", c.a_ms);
  c.b_ms = number_or(j, "b_ms", c.b_ms);
  return c;
}
}  // namespace detail

/// Replaces the fields of `d` that `j` gives (device_from_json's overrides, and the
/// "device" object switch_probe.py writes): name, memory_gib, memory_bandwidth_gbs,
/// compute_efficiency, bandwidth_efficiency, launch_ms, reserved_gib, workspace_mib,
/// precisions [...], peak_tflops {"fp16": 60, ...}, cast_fits {"float_to_float" |
/// "quantize" | "dequantize": {"a_ms", "b_ms"}} and the host time of a precision switch
/// under the plan applier: cast_host_ms, cast_backward_host_ms, wrap_host_ms,
/// wrap_backward_host_ms, function_call_host_ms.
inline void apply_device_fields(device_profile& d, const nlohmann::json& j) {
  LOWBIT_EXPECTS(j.is_object(), "device: expected an object");
  d.name = j.value("name", d.name);
  d.memory_gib = detail::number_or(j, "memory_gib", d.memory_gib);
  d.memory_bandwidth_gbs = detail::number_or(j, "memory_bandwidth_gbs", d.memory_bandwidth_gbs);
  d.compute_efficiency = detail::number_or(j, "compute_efficiency", d.compute_efficiency);
  d.bandwidth_efficiency = detail::number_or(j, "bandwidth_efficiency", d.bandwidth_efficiency);
  d.launch_ms = detail::number_or(j, "launch_ms", d.launch_ms);
  d.reserved_gib = detail::number_or(j, "reserved_gib", d.reserved_gib);
  d.workspace_mib = detail::number_or(j, "workspace_mib", d.workspace_mib);
  if (j.contains("precisions")) d.precisions = detail::precisions_of(j["precisions"]);
  if (j.contains("peak_tflops"))
    for (const auto& [k, v] : j["peak_tflops"].items())
      d.peak_tflops[index_of(parse_precision(k))] = v.get<double>();
  if (j.contains("cast_fits"))
    for (const auto& [k, v] : j["cast_fits"].items()) {
      linear_cost* c = k == "float_to_float" ? &d.casts.float_to_float
                       : k == "quantize"     ? &d.casts.quantize
                       : k == "dequantize"   ? &d.casts.dequantize
                                             : nullptr;
      LOWBIT_EXPECTS(c != nullptr,
                     "cast_fits: unknown fit '" + k + "' (float_to_float, quantize, dequantize)");
      *c = detail::linear_cost_of(v, *c);
    }
  d.switches.cast_forward_ms = detail::number_or(j, "cast_host_ms", d.switches.cast_forward_ms);
  d.switches.cast_backward_ms =
      detail::number_or(j, "cast_backward_host_ms", d.switches.cast_backward_ms);
  d.switches.wrap_ms = detail::number_or(j, "wrap_host_ms", d.switches.wrap_ms);
  d.switches.wrap_backward_ms =
      detail::number_or(j, "wrap_backward_host_ms", d.switches.wrap_backward_ms);
  d.switches.mode_call_ms = detail::number_or(j, "function_call_host_ms", d.switches.mode_call_ms);
  LOWBIT_EXPECTS(
      d.switches.wrap_ms >= 0 && d.switches.wrap_backward_ms >= 0 && d.switches.mode_call_ms >= 0,
      "device: wrap_host_ms, wrap_backward_host_ms and function_call_host_ms "
      "must be >= 0");
}

/// A device from JSON: a built-in name (`"T4"`), or `{"base": "T4", ...overrides}` with
/// any of the fields apply_device_fields takes: measured values replacing datasheet
/// ones. Without a base, the cast fits are the T4's scaled to the given bandwidth, unless
/// given.
inline device_profile device_from_json(const nlohmann::json& j) {
  if (j.is_string()) return builtin_device(j.get<std::string>());
  LOWBIT_EXPECTS(j.is_object(), "device: expected a name or an object");
  device_profile d =
      j.contains("base") ? builtin_device(j["base"].get<std::string>()) : device_profile{};
  if (!j.contains("base"))
    d.casts = scaled_cast_costs(detail::number_or(j, "memory_bandwidth_gbs", 320.0));
  apply_device_fields(d, j);
  LOWBIT_EXPECTS(!d.name.empty() && d.memory_bandwidth_gbs > 0 && d.memory_gib > 0,
                 "device needs a name, memory_gib and memory_bandwidth_gbs (or a base)");
  return d;
}

/// A link from JSON: a built-in name, or `{"base": ..., "bandwidth_gbs", "latency_ms"}`.
inline link_profile link_from_json(const nlohmann::json& j) {
  if (j.is_string()) return builtin_link(j.get<std::string>());
  LOWBIT_EXPECTS(j.is_object(), "link: expected a name or an object");
  link_profile l = j.contains("base") ? builtin_link(j["base"].get<std::string>()) : link_profile{};
  l.name = j.value("name", l.name.empty() ? std::string("link") : l.name);
  l.bandwidth_gbs = detail::number_or(j, "bandwidth_gbs", l.bandwidth_gbs);
  l.latency_ms = detail::number_or(j, "latency_ms", l.latency_ms);
  LOWBIT_EXPECTS(l.bandwidth_gbs > 0 && l.latency_ms >= 0, "link needs bandwidth_gbs > 0");
  return l;
}

/// One profiled precision of a device group: the instrumented trace (per-op ranges) and
/// optionally an un-instrumented trace of the same loop for host times.
struct profile_files {
  precision p = precision::fp32;
  std::string trace;
  std::string plain;  ///< empty: host times from the instrumented trace as they are
};

/// Parses `fp32=a.json,bf16=b.json` (the command line's --traces form).
inline std::vector<profile_files> parse_profile_list(const std::string& text) {
  std::vector<profile_files> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const std::size_t eq = item.find('=');
    LOWBIT_EXPECTS(eq != std::string::npos && eq > 0 && eq + 1 < item.size(),
                   "trace list item '" + item + "': expected PRECISION=FILE");
    out.push_back({parse_precision(item.substr(0, eq)), item.substr(eq + 1), {}});
    at = comma + 1;
  }
  return out;
}

/// Pairs un-instrumented traces (`fp32=a_plain.json,...`) with the profiles of the same
/// precision; a precision without a profile is an error.
inline void add_plain_traces(std::vector<profile_files>& profiles, const std::string& text) {
  for (const profile_files& q : parse_profile_list(text)) {
    auto it = std::find_if(profiles.begin(), profiles.end(),
                           [&](const profile_files& f) { return f.p == q.p; });
    LOWBIT_EXPECTS(it != profiles.end(), std::string("un-instrumented trace for ") +
                                             to_string(q.p) + " has no trace at that precision");
    it->plain = q.trace;
  }
}

/// Loads every profile into `table` (several precisions per device group: QSync profiles
/// each uniform precision once). Relative paths are taken from `base_dir`; a precision
/// given twice is an error.
inline void load_profiles(measured_table& table, const std::vector<profile_files>& profiles,
                          const op_graph& graph, const std::string& base_dir = ".") {
  auto full = [&](const std::string& path) {
    return path.empty() || path.front() == '/' || base_dir.empty() ? path : base_dir + "/" + path;
  };
  std::vector<precision> seen;
  for (const profile_files& f : profiles) {
    LOWBIT_EXPECTS(std::find(seen.begin(), seen.end(), f.p) == seen.end(),
                   std::string("two traces for ") + to_string(f.p));
    seen.push_back(f.p);
    const nlohmann::json trace = read_json_file(full(f.trace));
    if (f.plain.empty()) {
      add_profile(table, trace, f.p, graph);
    } else {
      const nlohmann::json plain = read_json_file(full(f.plain));
      add_profile(table, trace, f.p, graph, &plain);
    }
  }
}

/// The profiles of a cluster JSON group: `"trace": "file.json"` with
/// `"trace_precision"` (default fp32), or a list whose items are `"bf16=file.json"` or
/// `{"precision": "bf16", "file": "b.json", "plain": "b_plain.json"}`.
inline std::vector<profile_files> profiles_from_json(const nlohmann::json& x) {
  std::vector<profile_files> out;
  if (!x.contains("trace")) return out;
  const auto& t = x["trace"];
  if (t.is_string()) {
    out.push_back({parse_precision(x.value("trace_precision", std::string("fp32"))),
                   t.get<std::string>(), x.value("plain_trace", std::string())});
    return out;
  }
  LOWBIT_EXPECTS(t.is_array(), "\"trace\": expected a file name or a list");
  for (std::size_t n = 0; n < t.size(); ++n) {
    const auto& item = t[n];
    detail::at_place("trace[" + std::to_string(n) + "]", [&] {
      if (item.is_string()) {
        auto one = parse_profile_list(item.get<std::string>());
        LOWBIT_EXPECTS(one.size() == 1, "expected one PRECISION=FILE");
        out.push_back(one.front());
      } else {
        out.push_back({parse_precision(item.at("precision").get<std::string>()),
                       item.at("file").get<std::string>(), item.value("plain", std::string())});
      }
    });
  }
  return out;
}

/// A cluster from JSON:
/// `{"name", "link": <link>, "ranks_per_node", "inter_link": <link>, "schedule", "backend",
///   "groups": [{"device": <device>, "count",
///   "trace": "file.json" | ["fp32=a.json", {"precision", "file", "plain"}, ...],
///   "trace_precision": "fp32",
///   "measured": {"op": {"fp16": {"forward_ms", "backward_ms"}}}}]}`.
/// With `ranks_per_node` > 1 the cluster is nodes of that many ranks, `link` inside a
/// node and `inter_link` (required then) between them, so that buckets are planned as
/// hierarchical all-reduces (docs/multi-node.md); every node must be whole. "schedule" (a
/// builtin_schedule name, default "default") and "backend" ("nccl", the default, or "mpi")
/// say whether those all-reduces overlap their chunks, which their predicted time depends on.
/// Trace paths are relative to `base_dir`; traces and tables need the model's graph.
inline cluster cluster_from_json(const nlohmann::json& j, const op_graph& graph,
                                 const std::string& base_dir = ".") {
  LOWBIT_EXPECTS(j.is_object(), "cluster JSON: expected an object");
  cluster c;
  c.name = j.value("name", std::string("cluster"));
  LOWBIT_EXPECTS(j.contains("link"), "cluster JSON: no \"link\"");
  detail::at_place("cluster JSON link", [&] { c.link = link_from_json(j["link"]); });
  c.ranks_per_node = j.value("ranks_per_node", 0);
  LOWBIT_EXPECTS(c.ranks_per_node >= 0, "cluster JSON: ranks_per_node must be >= 0");
  if (c.ranks_per_node > 1) {
    LOWBIT_EXPECTS(j.contains("inter_link"),
                   "cluster JSON: ranks_per_node > 1 needs an \"inter_link\" between nodes");
    detail::at_place("cluster JSON inter_link",
                     [&] { c.inter_link = link_from_json(j["inter_link"]); });
  }
  detail::at_place("cluster JSON schedule", [&] {
    c.schedule = builtin_schedule(j.value("schedule", std::string("default")));
  });
  detail::at_place("cluster JSON backend", [&] {
    c.backend = parse_comm_backend(j.value("backend", std::string("nccl")));
  });
  LOWBIT_EXPECTS(j.contains("groups") && j["groups"].is_array() && !j["groups"].empty(),
                 "cluster JSON: no \"groups\" array");
  for (std::size_t n = 0; n < j["groups"].size(); ++n) {
    const auto& x = j["groups"][n];
    const std::string where = "cluster JSON groups[" + std::to_string(n) + "]";
    detail::at_place(where, [&] {
      device_group g;
      LOWBIT_EXPECTS(x.is_object() && x.contains("device"), where + ": no \"device\"");
      g.device = device_from_json(x["device"]);
      g.count = x.value("count", 1);
      LOWBIT_EXPECTS(g.count >= 1, where + ": count must be at least 1");
      load_profiles(g.measured, profiles_from_json(x), graph, base_dir);
      if (x.contains("measured"))
        for (const auto& [name, per] : x["measured"].items()) {
          LOWBIT_EXPECTS(graph.find(name).has_value(),
                         where + " measured: unknown op '" + name + "'");
          for (const auto& [pn, t] : per.items())
            g.measured.set(
                name, parse_precision(pn),
                {detail::number_or(t, "forward_ms", -1), detail::number_or(t, "backward_ms", -1)});
        }
      c.groups.push_back(std::move(g));
    });
  }
  LOWBIT_EXPECTS(c.ranks_per_node <= 1 || c.world_size() % c.ranks_per_node == 0,
                 "cluster JSON: " + std::to_string(c.world_size()) +
                     " ranks do not make whole nodes of ranks_per_node " +
                     std::to_string(c.ranks_per_node));
  return c;
}

/// A given plan from JSON, to predict it: `{"groups": [{"default": "fp16", "ops":
/// {"fc1": "fp32", ...}}, ...], "buckets": [{"bits": 8}, ...]}` (the form plan_to_json
/// writes), or `"bucket_bits": [8, ...]`; one entry under "groups" applies to every group,
/// and top-level "default"/"ops" stand for one such entry. Ops not listed take the
/// default (fp32 when none) moved to the nearest precision their menu allows; listed
/// parameter-free ops are ignored (they follow their input); buckets not given are fp32.
/// Unknown ops, precisions a device lacks and wrong list sizes are errors naming them.
inline plan plan_from_json(const simulator& sim, const nlohmann::json& j) {
  LOWBIT_EXPECTS(j.is_object(), "plan JSON: expected an object");
  plan pl;
  detail::at_place("plan JSON", [&] {
    std::vector<nlohmann::json> groups;
    if (j.contains("groups")) {
      for (const auto& g : j["groups"]) groups.push_back(g);
    } else {
      groups.push_back(j);
    }
    LOWBIT_EXPECTS(groups.size() == 1 || groups.size() == sim.group_count(),
                   "\"groups\" has " + std::to_string(groups.size()) + " entries, the cluster " +
                       std::to_string(sim.group_count()) + " device groups");
    const op_graph& gr = sim.graph();
    for (std::size_t g = 0; g < sim.group_count(); ++g) {
      const auto& x = groups[groups.size() == 1 ? 0 : g];
      const precision def = parse_precision(x.value("default", std::string("fp32")));
      std::vector<precision> v(gr.size());
      for (std::size_t i = 0; i < gr.size(); ++i) v[i] = nearest_allowed(sim.menu(g, i), def);
      if (x.contains("ops"))
        for (const auto& [name, pn] : x["ops"].items())
          v[gr.index_of(name)] = parse_precision(pn.get<std::string>());
      pl.precisions.push_back(sim.resolve(g, std::move(v)));
    }
    pl.bucket_bits.assign(sim.buckets().size(), 32);
    std::vector<int> bits;
    if (j.contains("buckets"))
      for (const auto& b : j["buckets"]) bits.push_back(b.at("bits").get<int>());
    if (j.contains("bucket_bits")) bits = j["bucket_bits"].get<std::vector<int>>();
    if (j.contains("buckets") || j.contains("bucket_bits")) {
      LOWBIT_EXPECTS(bits.size() == pl.bucket_bits.size(),
                     "plan has " + std::to_string(bits.size()) + " bucket widths, the model " +
                         std::to_string(pl.bucket_bits.size()) + " buckets");
      for (int b : bits) (void)wire_bytes(b, 1);  // validates the widths
      pl.bucket_bits = bits;
    }
  });
  return pl;
}

namespace detail {
// One group's predicted time and memory (GiB, by category).
inline nlohmann::ordered_json group_json(const simulator& sim, const evaluation& e, std::size_t g) {
  constexpr double gib = 1024.0 * 1024.0 * 1024.0;
  const auto& grp = sim.hardware().groups[g];
  const memory_breakdown& m = e.groups[g].memory;
  nlohmann::ordered_json gj;
  gj["device"] = grp.device.name;
  gj["count"] = grp.count;
  gj["predicted_ms"] = e.times.device_ms[g];
  gj["memory_gib"] = m.total() / gib;
  gj["usable_gib"] = grp.device.usable_bytes() / gib;
  gj["fits"] = e.groups[g].fits;
  gj["memory"] = {{"weights", m.weights / gib},
                  {"gradients", m.gradients / gib},
                  {"optimizer", m.optimizer / gib},
                  {"activations", m.activations / gib},
                  {"weight_copies", m.weight_copies / gib},
                  {"cast_copies", m.cast_copies / gib},
                  {"workspace", m.workspace / gib},
                  {"released", m.released / gib}};
  return gj;
}
}  // namespace detail

/// A prediction as JSON: `{"name", "iteration_ms", "groups": [{"device", "count",
/// "predicted_ms", "memory_gib", "usable_gib", "fits", "memory": {category: GiB}}]}`,
/// what scripts compare with measurements.
inline nlohmann::ordered_json evaluation_to_json(const simulator& sim, const std::string& name,
                                                 const evaluation& e) {
  nlohmann::ordered_json j;
  j["name"] = name;
  j["iteration_ms"] = e.iteration_ms();
  j["groups"] = nlohmann::ordered_json::array();
  for (std::size_t g = 0; g < sim.group_count(); ++g)
    j["groups"].push_back(detail::group_json(sim, e, g));
  return j;
}

/// The plan as JSON: target, prediction, per group the device, count, memory and every
/// op's precision (in execution order), per bucket its bits, size, ops and predicted
/// start and end.
inline nlohmann::ordered_json plan_to_json(const simulator& sim, const allocation& a) {
  using json = nlohmann::ordered_json;
  json j;
  j["model"] = sim.model().name;
  j["cluster"] = sim.hardware().name;
  j["target_ms"] = a.target_ms;
  j["target_met"] = a.target_met;
  j["predicted_iteration_ms"] = a.eval.iteration_ms();
  j["score"] = a.score;
  j["groups"] = json::array();
  for (std::size_t g = 0; g < sim.group_count(); ++g) {
    json gj = detail::group_json(sim, a.eval, g);
    json ops = json::object();
    for (std::size_t i : sim.graph().topo_order())
      ops[sim.graph().at(i).name] = to_string(a.result.precisions[g][i]);
    gj["ops"] = std::move(ops);
    j["groups"].push_back(std::move(gj));
  }
  j["buckets"] = json::array();
  for (std::size_t k = 0; k < sim.buckets().size(); ++k) {
    json bj;
    bj["bits"] = a.result.bucket_bits[k];
    bj["numel"] = sim.buckets()[k].numel;
    bj["start_ms"] = a.eval.times.bucket_start[k];
    bj["end_ms"] = a.eval.times.bucket_end[k];
    std::vector<std::string> names;
    for (std::size_t i : sim.buckets()[k].ops) names.push_back(sim.graph().at(i).name);
    bj["ops"] = names;
    j["buckets"].push_back(std::move(bj));
  }
  return j;
}

}  // namespace lowbit::qsync
