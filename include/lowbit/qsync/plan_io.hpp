// JSON in and out: model and cluster descriptions (with measured overrides) for the
// planner, and the plan it writes. Errors name the place in the document.
#pragma once

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
/// `{"name", "optimizer_bytes_per_param", "bucket_cap_mb", "first_bucket_mb",
///   "ops": [{"name", "kind", "flops", "bytes", "output_numel", "saved_numel",
///            "param_numel", "inputs": [...], "allowed": ["fp16", ...],
///            "stats": {"weight_norm", ...}}]}`.
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
      if (x.contains("inputs")) o.inputs = x["inputs"].get<std::vector<std::string>>();
      if (x.contains("allowed")) o.allowed = detail::precisions_of(x["allowed"]);
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

/// A device from JSON: a built-in name (`"T4"`), or `{"base": "T4", ...overrides}` with
/// any of name, memory_gib, memory_bandwidth_gbs, compute_efficiency,
/// bandwidth_efficiency, launch_ms, reserved_gib, precisions [...], and
/// peak_tflops {"fp16": 60, ...}: measured values replacing datasheet ones.
inline device_profile device_from_json(const nlohmann::json& j) {
  if (j.is_string()) return builtin_device(j.get<std::string>());
  LOWBIT_EXPECTS(j.is_object(), "device: expected a name or an object");
  device_profile d =
      j.contains("base") ? builtin_device(j["base"].get<std::string>()) : device_profile{};
  d.name = j.value("name", d.name);
  d.memory_gib = detail::number_or(j, "memory_gib", d.memory_gib);
  d.memory_bandwidth_gbs = detail::number_or(j, "memory_bandwidth_gbs", d.memory_bandwidth_gbs);
  d.compute_efficiency = detail::number_or(j, "compute_efficiency", d.compute_efficiency);
  d.bandwidth_efficiency = detail::number_or(j, "bandwidth_efficiency", d.bandwidth_efficiency);
  d.launch_ms = detail::number_or(j, "launch_ms", d.launch_ms);
  d.reserved_gib = detail::number_or(j, "reserved_gib", d.reserved_gib);
  if (j.contains("precisions")) d.precisions = detail::precisions_of(j["precisions"]);
  if (j.contains("peak_tflops"))
    for (const auto& [k, v] : j["peak_tflops"].items())
      d.peak_tflops[index_of(parse_precision(k))] = v.get<double>();
  if (!j.contains("base")) d.casts = scaled_cast_costs(d.memory_bandwidth_gbs);
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

/// A cluster from JSON:
/// `{"name", "link": <link>, "ranks_per_node", "inter_link": <link>,
///   "groups": [{"device": <device>, "count",
///   "trace": "file.json", "trace_precision": "fp32",
///   "measured": {"op": {"fp16": {"forward_ms", "backward_ms"}}}}]}`.
/// With `ranks_per_node` > 1 the cluster is nodes of that many ranks, `link` inside a
/// node and `inter_link` (required then) between them, so that buckets are planned as
/// hierarchical all-reduces (docs/multi-node.md); every node must be whole.
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
      if (x.contains("trace")) {
        std::string path = x["trace"].get<std::string>();
        if (!path.empty() && path.front() != '/') path = base_dir + "/" + path;
        const precision p = parse_precision(x.value("trace_precision", std::string("fp32")));
        g.measured = measured_from_trace(read_json_file(path), p, graph);
      }
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

/// The plan as JSON: target, prediction, per group the device, count, memory and every
/// op's precision (in execution order), per bucket its bits, size, ops and predicted
/// start and end.
inline nlohmann::ordered_json plan_to_json(const simulator& sim, const allocation& a) {
  using json = nlohmann::ordered_json;
  constexpr double gib = 1024.0 * 1024.0 * 1024.0;
  json j;
  j["model"] = sim.model().name;
  j["cluster"] = sim.hardware().name;
  j["target_ms"] = a.target_ms;
  j["target_met"] = a.target_met;
  j["predicted_iteration_ms"] = a.eval.iteration_ms();
  j["score"] = a.score;
  j["groups"] = json::array();
  for (std::size_t g = 0; g < sim.group_count(); ++g) {
    const auto& grp = sim.hardware().groups[g];
    json gj;
    gj["device"] = grp.device.name;
    gj["count"] = grp.count;
    gj["predicted_ms"] = a.eval.times.device_ms[g];
    gj["memory_gib"] = a.eval.groups[g].memory.total() / gib;
    gj["usable_gib"] = grp.device.usable_bytes() / gib;
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
