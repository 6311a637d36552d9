#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "lowbit/qsync/models.hpp"
#include "lowbit/qsync/plan_io.hpp"
#include "lowbit/qsync/trace_loader.hpp"

using namespace lowbit::qsync;
using Catch::Matchers::Contains;
using json = nlohmann::json;

namespace {
const std::string data_dir = LOWBIT_TEST_DATA_DIR;

training_model tiny_model() {
  return model_from_json(read_json_file(data_dir + "/qsync_tiny_model.json"));
}
}  // namespace

TEST_CASE("trace loader: kernels matched to user ranges by correlation, averaged") {
  const json trace = read_json_file(data_dir + "/qsync_tiny_trace.json");
  const trace_ranges r = read_trace_ranges(trace);
  // fc1: 120 and 140 us; fc2: 80+20 and 90+20; backward ranges on their own thread.
  REQUIRE(r.gpu_ms.at("fc1") == Approx(0.130));
  REQUIRE(r.gpu_ms.at("relu") == Approx(0.030));
  REQUIRE(r.gpu_ms.at("fc2") == Approx(0.105));
  REQUIRE(r.gpu_ms.at("fc2.backward") == Approx(0.240));
  REQUIRE(r.gpu_ms.at("fc1.backward") == Approx(0.210));
  REQUIRE(r.occurrences.at("fc1") == 2);
  // 1510 us of kernels over two ProfilerSteps; the ops' ranges hold 715 us of each.
  REQUIRE(r.kernel_ms == Approx(0.755));
  // Kernels that were queued start 10 us after the device's last one ended.
  REQUIRE(r.dispatch_gap_ms == Approx(0.010));

  const training_model m = tiny_model();
  std::vector<std::string> skipped;
  const measured_table t = measured_from_trace(trace, precision::fp32, m.graph, &skipped);
  // An op's time is its kernels' and their dispatch gaps: fc1's one kernel, 130 us on
  // average, and 10 us.
  REQUIRE(t.find("fc1", precision::fp32)->forward_ms == Approx(0.140));
  REQUIRE(t.find("fc1", precision::fp32)->backward_ms == Approx(0.220));  // 210 + 10 us
  REQUIRE(t.find("relu", precision::fp32)->backward_ms == -1);            // not traced: roofline
  REQUIRE(t.find("fc1", precision::fp16) == nullptr);
  REQUIRE(std::find(skipped.begin(), skipped.end(), "ProfilerStep#1") != skipped.end());
  const cost_model cm(t4(), t);
  REQUIRE(cm.time(m.graph.at(1), precision::fp32).forward_ms == Approx(0.040));  // relu: 30 + 10 us
  REQUIRE(cm.time(m.graph.at(1), precision::fp32).backward_ms > 0);
}

TEST_CASE("trace loader: gpu_user_annotation ranges are used directly") {
  const json trace = json::parse(R"({"traceEvents": [
    {"ph": "X", "cat": "gpu_user_annotation", "name": "fc1", "ts": 5, "dur": 300, "pid": 0, "tid": 7},
    {"ph": "X", "cat": "gpu_user_annotation", "name": "fc1", "ts": 905, "dur": 100, "pid": 0, "tid": 7},
    {"ph": "i", "cat": "instant", "name": "marker", "ts": 1},
    {"ph": "X", "cat": "user_annotation", "name": "fc1", "ts": 0, "dur": 10, "pid": 1, "tid": 1}
  ]})");
  REQUIRE(read_trace_ranges(trace).gpu_ms.at("fc1") == Approx(0.2));
  REQUIRE_THROWS_WITH(read_trace_ranges(json::parse(R"({"events": []})")),
                      Contains("no \"traceEvents\""));
  REQUIRE_THROWS_WITH(read_trace_ranges(json::parse(R"([{"ph": "X", "cat": "kernel"}])")),
                      Contains("malformed trace event #0"));
}

TEST_CASE(
    "trace loader: kernel time by correlation, once across streams, gaps and empty "
    "ranges excluded, the rest a tail") {
  // One occurrence of "conv": its launches at ts 11 and 12 run kernels of 30 us on two
  // streams, spanned by one gpu_user_annotation per stream (same External id) with an idle
  // gap inside; "view" launches nothing; a kernel launched outside every range (40 us) is
  // the optimizer's.
  const json trace = json::parse(R"({"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0, "dur": 500, "pid": 0, "tid": 1},
    {"ph": "X", "cat": "user_annotation", "name": "conv", "ts": 10, "dur": 20, "pid": 0, "tid": 1, "args": {"External id": 9}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 11, "dur": 1, "pid": 0, "tid": 1, "args": {"correlation": 101}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 12, "dur": 1, "pid": 0, "tid": 1, "args": {"correlation": 102}},
    {"ph": "X", "cat": "user_annotation", "name": "view", "ts": 40, "dur": 5, "pid": 0, "tid": 1},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 60, "dur": 1, "pid": 0, "tid": 1, "args": {"correlation": 103}},
    {"ph": "X", "cat": "kernel", "name": "k1", "ts": 100, "dur": 30, "pid": 1, "tid": 7, "args": {"correlation": 101}},
    {"ph": "X", "cat": "kernel", "name": "k2", "ts": 170, "dur": 30, "pid": 1, "tid": 8, "args": {"correlation": 102}},
    {"ph": "X", "cat": "kernel", "name": "adam", "ts": 300, "dur": 40, "pid": 1, "tid": 7, "args": {"correlation": 103}},
    {"ph": "X", "cat": "gpu_user_annotation", "name": "conv", "ts": 100, "dur": 100, "pid": 1, "tid": 7, "args": {"External id": 9}},
    {"ph": "X", "cat": "gpu_user_annotation", "name": "conv", "ts": 170, "dur": 30, "pid": 1, "tid": 8, "args": {"External id": 9}}
  ]})");
  const trace_ranges r = read_trace_ranges(trace);
  REQUIRE(r.gpu_ms.at("conv") == Approx(0.060));  // not the 0.130 of the spans, not halved
  REQUIRE(r.occurrences.at("conv") == 1);
  REQUIRE(r.gpu_ms.at("view") == 0.0);  // measured: nothing, not missing
  REQUIRE(r.kernel_ms == Approx(0.100));
  op conv, view;
  conv.name = "conv";
  view.name = "view";
  view.inputs = {"conv"};
  const op_graph g({conv, view});
  REQUIRE(tail_ms(r, g) == Approx(0.040));
}

TEST_CASE("trace loader: the device's dispatch gap, from kernels that waited for the GPU") {
  // Four kernels of "mm" on one stream, all launched by ts 5. The device idles 2 us before
  // k2, 4 us before k3 (queued: both gaps are the device's), then 50 us before k4, which
  // was launched only at ts 150 (the host's gap, not counted). The median of {2, 4} (the
  // upper one) is 4 us; "mm" keeps the stream busy for its 40 us of kernels plus 4 us each.
  const json trace = json::parse(R"({"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 300, "pid": 0, "tid": 1},
    {"ph": "X", "cat": "user_annotation", "name": "mm", "ts": 1, "dur": 160, "pid": 0, "tid": 1},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 2, "dur": 1, "pid": 0, "tid": 1, "args": {"correlation": 1}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 3, "dur": 1, "pid": 0, "tid": 1, "args": {"correlation": 2}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 4, "dur": 1, "pid": 0, "tid": 1, "args": {"correlation": 3}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 150, "dur": 1, "pid": 0, "tid": 1, "args": {"correlation": 4}},
    {"ph": "X", "cat": "kernel", "name": "k1", "ts": 10, "dur": 10, "pid": 1, "tid": 7, "args": {"correlation": 1}},
    {"ph": "X", "cat": "kernel", "name": "k2", "ts": 22, "dur": 10, "pid": 1, "tid": 7, "args": {"correlation": 2}},
    {"ph": "X", "cat": "kernel", "name": "k3", "ts": 36, "dur": 10, "pid": 1, "tid": 7, "args": {"correlation": 3}},
    {"ph": "X", "cat": "kernel", "name": "k4", "ts": 160, "dur": 10, "pid": 1, "tid": 7, "args": {"correlation": 4}}
  ]})");
  const trace_ranges r = read_trace_ranges(trace);
  REQUIRE(r.dispatch_gap_ms == Approx(0.004));
  REQUIRE(r.kernels.at("mm") == 4);
  REQUIRE(r.kernels_per_iteration == 4);
  REQUIRE(r.gpu_ms.at("mm") == Approx(0.040));
  REQUIRE(r.busy_ms("mm") == Approx(0.056));
  op mm;
  mm.name = "mm";
  const op_graph g({mm});
  REQUIRE(measured_from_trace(trace, precision::fp32, g).find("mm", precision::fp32)->forward_ms ==
          Approx(0.056));
  REQUIRE(tail_ms(r, g) == Approx(0.0));
}

TEST_CASE(
    "trace loader: without kernels, gpu_user_annotation spans count one occurrence per "
    "External id") {
  const json trace = json::parse(R"({"traceEvents": [
    {"ph": "X", "cat": "gpu_user_annotation", "name": "conv", "ts": 0, "dur": 100, "pid": 1, "tid": 7, "args": {"External id": 9}},
    {"ph": "X", "cat": "gpu_user_annotation", "name": "conv", "ts": 0, "dur": 60, "pid": 1, "tid": 8, "args": {"External id": 9}},
    {"ph": "X", "cat": "gpu_user_annotation", "name": "conv", "ts": 900, "dur": 40, "pid": 1, "tid": 7, "args": {"External id": 19}}
  ]})");
  const trace_ranges r = read_trace_ranges(trace);
  REQUIRE(r.occurrences.at("conv") == 2);
  REQUIRE(r.gpu_ms.at("conv") == Approx(0.100));
}

TEST_CASE("model JSON: ops, kinds, allowed precisions and stats") {
  const training_model m = tiny_model();
  REQUIRE(m.name == "tiny-mlp");
  REQUIRE(m.graph.size() == 3);
  REQUIRE(m.optimizer_bytes_per_param == 4);
  REQUIRE(m.graph.at(2).stats.input_absmax == 6);
  REQUIRE(m.graph.at(1).kind == op_kind::relu);
}

TEST_CASE("model JSON: frozen and unused parameters") {
  const training_model m = model_from_json(json::parse(
      R"({"ops": [{"name": "a", "param_numel": 10, "frozen_numel": 4}, {"name": "b"}],
          "unused_params": {"numel": 7, "names": ["x.weight"]}})"));
  REQUIRE(m.graph.at(0).frozen_numel == 4);
  REQUIRE(m.graph.at(0).trainable_numel() == 6);
  REQUIRE(m.unused_param_numel == 7);
  REQUIRE(model_from_json(json::parse(R"({"ops": [{"name": "a"}]})")).unused_param_numel == 0);
  REQUIRE_THROWS_WITH(
      model_from_json(json::parse(R"({"ops": [{"name": "a"}], "unused_params": {"numel": -1}})")),
      Contains("\"unused_params\" numel must be >= 0"));
}

TEST_CASE("model JSON: an op running with another op's weights") {
  const training_model m = model_from_json(json::parse(
      R"({"ops": [{"name": "emb", "kind": "embedding", "param_numel": 10},
                  {"name": "head", "kind": "linear", "inputs": ["emb"], "weights_from": ["emb"]}]})"));
  REQUIRE(m.graph.at(1).weights_from == "emb");
  REQUIRE(m.graph.weights_holder(1) == std::optional<std::size_t>(0));
  REQUIRE(m.graph.weights_holder(0) == std::optional<std::size_t>(0));
  auto parse = [](const char* text) { return model_from_json(json::parse(text)); };
  REQUIRE_THROWS_WITH(
      parse(R"({"ops": [{"name": "emb", "param_numel": 10},
                                         {"name": "head", "weights_from": ["emb"]}]})"),
      Contains("op 'head' takes weights_from 'emb', which is not under its inputs"));
  REQUIRE_THROWS_WITH(parse(R"({"ops": [{"name": "a", "param_numel": 1}, {"name": "b",
                                         "param_numel": 1, "inputs": ["a"], "weights_from": ["a"]}]})"),
                      Contains("op 'b' holds parameters and takes weights_from 'a'"));
  // A holder without parameters (zero-sized ones) shares nothing.
  REQUIRE_FALSE(parse(R"({"ops": [{"name": "a"},
                                   {"name": "b", "inputs": ["a"], "weights_from": ["a"]}]})")
                    .graph.weights_holder(1)
                    .has_value());
  REQUIRE_THROWS_WITH(parse(R"({"ops": [{"name": "a", "param_numel": 1}, {"name": "b",
                                         "inputs": ["a"], "weights_from": ["a", "a"]}]})"),
                      Contains("\"weights_from\" names at most one op"));
}

TEST_CASE("model JSON: measured bytes per precision") {
  const training_model m = model_from_json(json::parse(
      R"({"ops": [{"name": "head", "param_numel": 10, "saved_bytes": {"bf16": 3},
                   "workspace_bytes": {"bf16": 5}, "code_workspace_bytes": {"bf16": 7, "fp32": 9}}]})"));
  const op& head = m.graph.at(0);
  REQUIRE(head.saved_bytes[index_of(precision::bf16)] == 3);
  REQUIRE(head.workspace_bytes[index_of(precision::bf16)] == 5);
  REQUIRE(head.code_workspace_bytes[index_of(precision::bf16)] == 7);
  REQUIRE(head.code_workspace_bytes[index_of(precision::fp32)] == 9);
  REQUIRE(head.code_workspace_bytes[index_of(precision::fp16)] < 0);  // not measured
}

TEST_CASE("model JSON errors name the place") {
  auto parse = [](const char* text) { return model_from_json(json::parse(text)); };
  REQUIRE_THROWS_WITH(parse(R"({"ops": [{"name": "a"}, {"name": "b", "inputs": ["zz"]}]})"),
                      Contains("op 'b' has unknown input op 'zz'"));
  REQUIRE_THROWS_WITH(
      parse(R"({"ops": [{"name": "a", "inputs": ["b"]}, {"name": "b", "inputs": ["a"]}]})"),
      Contains("cycle in the op graph"));
  REQUIRE_THROWS_WITH(parse(R"({"ops": [{"name": "a"}, {"name": "b", "kind": "warp"}]})"),
                      Contains("model JSON ops[1] ('b'): unknown op kind 'warp'"));
  REQUIRE_THROWS_WITH(parse(R"({"ops": [{"name": "a", "flops": "many"}]})"),
                      Contains("ops[0] ('a')"));
  REQUIRE_THROWS_WITH(parse(R"({"ops": [{"name": "a", "allowed": ["fp4"]}]})"),
                      Contains("unknown precision 'fp4'"));
  REQUIRE_THROWS_WITH(parse(R"({"layers": []})"), Contains("no \"ops\" array"));
}

TEST_CASE("malformed JSON files are reported with the file and byte") {
  const std::string path = "qsync_io_test_malformed.json";
  std::ofstream(path) << "{\"ops\": [ {\"name\": \"a\",, } ]}";
  REQUIRE_THROWS_WITH(read_json_file(path),
                      Contains("malformed JSON in 'qsync_io_test_malformed.json' at byte"));
  std::remove(path.c_str());
  REQUIRE_THROWS_WITH(read_json_file("no/such/file.json"), Contains("cannot open"));
}

TEST_CASE("cluster JSON: built-ins, overrides, a trace and a measured table") {
  const training_model m = tiny_model();
  const cluster c =
      cluster_from_json(read_json_file(data_dir + "/qsync_tiny_cluster.json"), m.graph, data_dir);
  REQUIRE(c.world_size() == 4);
  REQUIRE(c.link.bandwidth_gbs == Approx(3.125));
  REQUIRE(c.link.latency_ms == 0.05);
  REQUIRE(c.groups[0].device.name == "T4");
  REQUIRE(c.groups[0].device.memory_gib == 15);
  // fc2's two kernels (105 us) and their two 10 us dispatch gaps.
  REQUIRE(c.groups[0].measured.find("fc2", precision::fp32)->forward_ms == Approx(0.125));
  REQUIRE(c.groups[1].measured.find("fc1", precision::fp16)->backward_ms == 0.04);
  REQUIRE_THROWS_WITH(
      cluster_from_json(json::parse(R"({"link": "nvlink4", "groups": [{"device": "TPU"}]})"),
                        m.graph),
      Contains("cluster JSON groups[0]: unknown device 'TPU'"));
  REQUIRE_THROWS_WITH(
      cluster_from_json(json::parse(R"({"link": "nvlink4", "groups": [{"device": "T4",
          "measured": {"fc9": {"fp16": {"forward_ms": 1}}}}]})"),
                        m.graph),
      Contains("unknown op 'fc9'"));
  REQUIRE_THROWS_WITH(cluster_from_json(json::parse(R"({"link": "nvlink4", "groups": [{"device":
          {"base": "T4", "peak_tflops": {"fp5": 1}}}]})"),
                                        m.graph),
                      Contains("unknown precision 'fp5'"));
}

TEST_CASE("cluster JSON: nodes of ranks_per_node ranks with an inter_link between them") {
  const training_model m = tiny_model();
  const cluster c = cluster_from_json(json::parse(R"({"link": "nvlink4", "ranks_per_node": 2,
      "inter_link": {"base": "ib-ndr", "bandwidth_gbs": 25},
      "groups": [{"device": "H200", "count": 4}]})"),
                                      m.graph);
  REQUIRE(c.ranks_per_node == 2);
  REQUIRE(c.hierarchical());
  REQUIRE(c.inter_link.bandwidth_gbs == 25);
  REQUIRE(c.inter_link.latency_ms == builtin_link("ib-ndr").latency_ms);
  const cluster flat = cluster_from_json(
      json::parse(R"({"link": "nvlink4", "groups": [{"device": "H200", "count": 4}]})"), m.graph);
  REQUIRE(!flat.hierarchical());
  REQUIRE_THROWS_WITH(cluster_from_json(json::parse(R"({"link": "nvlink4", "ranks_per_node": 2,
      "groups": [{"device": "H200", "count": 4}]})"),
                                        m.graph),
                      Contains("needs an \"inter_link\""));
  REQUIRE_THROWS_WITH(cluster_from_json(json::parse(R"({"link": "nvlink4", "ranks_per_node": 3,
      "inter_link": "ib-ndr", "groups": [{"device": "H200", "count": 4}]})"),
                                        m.graph),
                      Contains("do not make whole nodes"));
  // The all-reduce's schedule and backend: the library's defaults, or named.
  REQUIRE(c.backend == comm_backend::nccl);
  REQUIRE(c.schedule.name == "default");
  const cluster mpi = cluster_from_json(json::parse(R"({"link": "nvlink4", "ranks_per_node": 2,
      "inter_link": "ib-ndr", "schedule": "pipelined4", "backend": "mpi",
      "groups": [{"device": "H200", "count": 4}]})"),
                                        m.graph);
  REQUIRE(mpi.backend == comm_backend::mpi);
  REQUIRE(mpi.schedule.max_chunks == 4);
  REQUIRE_THROWS_WITH(cluster_from_json(json::parse(R"({"link": "nvlink4", "backend": "gloo",
      "groups": [{"device": "H200", "count": 4}]})"),
                                        m.graph),
                      Contains("cluster JSON backend") && Contains("unknown backend 'gloo'"));
}

TEST_CASE("plan JSON carries every op's precision and every bucket's bits") {
  const training_model m = tiny_model();
  const cluster c =
      cluster_from_json(read_json_file(data_dir + "/qsync_tiny_cluster.json"), m.graph, data_dir);
  const simulator sim(m, c);
  const std::vector<int> bits = {4, 8, 16, 32};
  const allocation_problem pb(sim, indicator_scores(sim, bits), bits, default_target_ms(sim, bits));
  const allocation a = greedy_allocate(pb);
  const auto j = plan_to_json(sim, a);
  REQUIRE(j["model"] == "tiny-mlp");
  REQUIRE(j["groups"].size() == 2);
  REQUIRE(j["groups"][0]["ops"].size() == 3);
  REQUIRE(j["groups"][0]["ops"]["fc1"] == to_string(a.result.precisions[0][0]));
  REQUIRE(j["groups"][0]["ops"].begin().key() == "fc1");  // execution order
  REQUIRE(j["buckets"].size() == sim.buckets().size());
  REQUIRE(j["buckets"][0]["bits"] == a.result.bucket_bits[0]);
  REQUIRE(j["predicted_iteration_ms"].get<double>() == Approx(a.eval.iteration_ms()));
}
