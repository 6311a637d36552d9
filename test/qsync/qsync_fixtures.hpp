// Small hand-made devices, graphs and simulators for the qsync tests.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "lowbit/qsync/cluster.hpp"
#include "lowbit/qsync/device_profile.hpp"
#include "lowbit/qsync/op_graph.hpp"
#include "lowbit/qsync/simulator.hpp"

namespace lowbit::qsync::test {

/// A device with round numbers: 1 TFLOP/s fp32, 2 fp16, 4 int8, 1000 GB/s at 100%
/// efficiency (1e9 FLOP/ms, 1e9 B/ms), no launch cost, `gib` GiB all usable, no casts.
inline device_profile round_device(std::string name = "round", double gib = 16) {
  device_profile d;
  d.name = std::move(name);
  d.peak_tflops[index_of(precision::fp32)] = 1;
  d.peak_tflops[index_of(precision::fp16)] = 2;
  d.peak_tflops[index_of(precision::int8)] = 4;
  d.memory_bandwidth_gbs = 1000;
  d.memory_gib = gib;
  d.reserved_gib = 0;
  d.compute_efficiency = d.bandwidth_efficiency = 1;
  d.launch_ms = 0;
  d.precisions = {precision::int8, precision::fp16, precision::fp32};
  d.casts = {};
  return d;
}

/// A linear op with parameters.
inline op linear_op(std::string name, std::vector<std::string> inputs, double params = 1000,
                    double saved = 1000, double out = 1000) {
  op o;
  o.name = std::move(name);
  o.kind = op_kind::linear;
  o.inputs = std::move(inputs);
  o.param_numel = params;
  o.saved_numel = saved;
  o.output_numel = out;
  o.flops = 1e6;
  o.bytes = 1e3;
  return o;
}

/// A chain of `n` linear ops named op0..op{n-1}.
inline std::vector<op> linear_chain(int n) {
  std::vector<op> ops;
  for (int i = 0; i < n; ++i)
    ops.push_back(linear_op("op" + std::to_string(i),
                            i == 0 ? std::vector<std::string>{}
                                   : std::vector<std::string>{"op" + std::to_string(i - 1)}));
  return ops;
}

/// A model around `ops` with no optimizer state and one bucket per `cap_mb` MiB.
inline training_model model_of(std::vector<op> ops, double cap_mb = 25, double first_mb = 1) {
  training_model m;
  m.name = "test";
  m.graph = op_graph(std::move(ops));
  m.optimizer_bytes_per_param = 0;
  m.bucket_cap_mb = cap_mb;
  m.first_bucket_mb = first_mb;
  return m;
}

}  // namespace lowbit::qsync::test
