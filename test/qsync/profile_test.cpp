// Profiles in: host times, tails, several precisions per device group, given plans, the
// memory terms autocast adds, and casts that a profile already holds.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "lowbit/qsync/models.hpp"
#include "lowbit/qsync/plan_io.hpp"
#include "lowbit/qsync/trace_loader.hpp"
#include "qsync_fixtures.hpp"

using namespace lowbit::qsync;
using namespace lowbit::qsync::test;
using Catch::Matchers::Contains;
using json = nlohmann::json;

namespace {
const std::string data_dir = LOWBIT_TEST_DATA_DIR;

// One iteration (us): "a" and "b" forward on the main thread (b waits 40 us in a stream
// sync), their backward on the autograd thread whose first event is at 400, an optimizer
// kernel launched outside every op, and a device sync at the end.
const char* instrumented = R"({"traceEvents": [
  {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 1000, "pid": 1, "tid": 1},
  {"ph": "X", "cat": "user_annotation", "name": "a", "ts": 100, "dur": 50, "pid": 1, "tid": 1},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 120, "dur": 5, "pid": 1, "tid": 1, "args": {"correlation": 1}},
  {"ph": "X", "cat": "user_annotation", "name": "b", "ts": 200, "dur": 100, "pid": 1, "tid": 1},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 250, "dur": 40, "pid": 1, "tid": 1},
  {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: AddmmBackward0", "ts": 400, "dur": 80, "pid": 1, "tid": 2},
  {"ph": "X", "cat": "user_annotation", "name": "b.backward", "ts": 420, "dur": 30, "pid": 1, "tid": 2},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 430, "dur": 5, "pid": 1, "tid": 2, "args": {"correlation": 2}},
  {"ph": "X", "cat": "user_annotation", "name": "a.backward", "ts": 470, "dur": 20, "pid": 1, "tid": 2},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 600, "dur": 5, "pid": 1, "tid": 1, "args": {"correlation": 3}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "ts": 900, "dur": 80, "pid": 1, "tid": 1},
  {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 130, "dur": 10, "pid": 0, "tid": 7, "args": {"correlation": 1}},
  {"ph": "X", "cat": "kernel", "name": "gemm_bwd", "ts": 440, "dur": 20, "pid": 0, "tid": 7, "args": {"correlation": 2}},
  {"ph": "X", "cat": "kernel", "name": "sgd", "ts": 610, "dur": 5, "pid": 0, "tid": 7, "args": {"correlation": 3}}
]})";

// The same loop without ranges: 900 us per step, 100 of them waiting.
const char* plain = R"({"traceEvents": [
  {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 900, "pid": 1, "tid": 1},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "ts": 800, "dur": 100, "pid": 1, "tid": 1}
]})";

op_graph ab_graph() {
  op a = linear_op("a", {});
  op b = linear_op("b", {"a"});
  return op_graph({a, b});
}

/// trace_ranges::host_ms and cpu_ms worked out by hand from a trace's events, in the case
/// of one host thread, ranges one after another and no synchronising call (a CPU run, as
/// make_test_traces.py's): an iteration's host time is its ProfilerStep#N range's
/// duration; a range's host time runs from the end of the range before it in the same
/// step (the step's start for the first) to its own end, averaged over its occurrences in
/// the step; each the median over the steps (the mean of the middle two for an even
/// count), in ms. Checks that the trace is that case.
struct host_times {
  int steps = 0;
  double host_ms = 0;
  std::map<std::string, double> cpu_ms;
};
double median_by_hand(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v.at(n / 2) : (v.at(n / 2 - 1) + v.at(n / 2)) / 2;
}
host_times host_times_by_hand(const json& trace) {
  using span = std::tuple<double, double, std::string>;  // start, end, name (us)
  std::vector<span> steps, ranges;
  std::vector<std::string> syncs, threads;
  for (const json& e : trace.at("traceEvents")) {
    if (e.value("ph", "") != "X") continue;
    const std::string name = e.value("name", "");
    if (name.find("Synchronize") != std::string::npos ||
        (name.rfind("cudaMemcpy", 0) == 0 && name.find("Async") == std::string::npos))
      syncs.push_back(name);
    if (e.value("cat", "") != "user_annotation") continue;
    const std::string tid = e.at("tid").dump();
    if (std::find(threads.begin(), threads.end(), tid) == threads.end()) threads.push_back(tid);
    const double ts = e.at("ts").get<double>();
    (name.rfind("ProfilerStep#", 0) == 0 ? steps : ranges)
        .emplace_back(ts, ts + e.at("dur").get<double>(), name);
  }
  REQUIRE(syncs.empty());
  REQUIRE(threads.size() == 1);
  std::sort(steps.begin(), steps.end());
  std::sort(ranges.begin(), ranges.end());
  host_times h;
  h.steps = static_cast<int>(steps.size());
  std::vector<double> step_ms;
  std::map<std::string, std::vector<double>> per_step;  // a range's mean in each step
  std::vector<std::string> nested;
  for (const auto& [s0, s1, s_name] : steps) {
    step_ms.push_back((s1 - s0) / 1000.0);
    std::map<std::string, std::pair<double, int>> in_step;
    double prev = s0;
    for (const auto& [r0, r1, r_name] : ranges) {
      if (r0 < s0 || r0 > s1) continue;
      if (r0 < prev) nested.push_back(r_name);
      in_step[r_name].first += (r1 - prev) / 1000.0;
      ++in_step[r_name].second;
      prev = r1;
    }
    for (const auto& [name, at] : in_step) per_step[name].push_back(at.first / at.second);
  }
  REQUIRE(nested.empty());
  h.host_ms = median_by_hand(step_ms);
  for (const auto& [name, v] : per_step) h.cpu_ms[name] = median_by_hand(v);
  return h;
}
}  // namespace

TEST_CASE("trace loader: host time per range includes the gap before it, not waits") {
  const trace_ranges r = read_trace_ranges(json::parse(instrumented));
  REQUIRE(r.cpu_ms.at("a") == Approx(0.150));           // from the step's start at 0
  REQUIRE(r.cpu_ms.at("b") == Approx(0.110));           // 150 -> 300, less the 40 us sync
  REQUIRE(r.cpu_ms.at("b.backward") == Approx(0.050));  // from the thread's first event
  REQUIRE(r.cpu_ms.at("a.backward") == Approx(0.040));
  REQUIRE(r.host_ms == Approx(0.880));  // 1000 us less 120 us of syncs
  REQUIRE(r.iterations == 1);
  REQUIRE(read_trace_ranges(json::parse(plain)).host_ms == Approx(0.800));
}

TEST_CASE("trace loader: a stall of the host in one profiled step is no op's host time") {
  // Three steps of "a" then "b" on one thread; in the second, the host stalls 5000 us
  // before "b" (a descheduled thread: no runtime call, nothing to subtract). Each range and
  // each step keeps its median over the steps: the stall is neither "b"'s nor the step's
  // (a mean would give "b" 2167 us and the step 2567), and a plain trace of 700 us a step
  // takes 100 us off each of the two ranges (after a mean: all of "a", 1567 us of "b").
  json tr = json::parse(R"({"traceEvents": []})");
  auto range = [&](const std::string& name, double ts, double dur) {
    tr["traceEvents"].push_back({{"ph", "X"},
                                 {"cat", "user_annotation"},
                                 {"name", name},
                                 {"ts", ts},
                                 {"dur", dur},
                                 {"pid", 1},
                                 {"tid", 1}});
  };
  for (int s = 0; s < 3; ++s) {
    const double t0 = 10000.0 * s, stall = s == 1 ? 5000.0 : 0.0;
    range("ProfilerStep#" + std::to_string(s), t0, 900 + stall);
    range("a", t0 + 100, 200);          // 300 us from the step's start
    range("b", t0 + 500 + stall, 300);  // 500 us from a's end (5500 in the stalled step)
  }
  const trace_ranges r = read_trace_ranges(tr);
  REQUIRE(r.iterations == 3);
  REQUIRE(r.cpu_ms.at("a") == Approx(0.300));
  REQUIRE(r.cpu_ms.at("b") == Approx(0.500));
  REQUIRE(r.host_ms == Approx(0.900));
  const op_graph g = ab_graph();
  const json pl = json::parse(R"({"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 700, "pid": 1, "tid": 1}]})");
  measured_table t;
  add_profile(t, tr, precision::fp16, g, &pl);
  REQUIRE(t.find_host("a", precision::fp16)->forward_ms == Approx(0.200));
  REQUIRE(t.find_host("b", precision::fp16)->forward_ms == Approx(0.400));
  REQUIRE(t.find_tail(precision::fp16)->cpu_ms == Approx(0.700 - 0.600));
}

TEST_CASE("add_profile: op GPU and host times, the measured tail, overhead from a plain trace") {
  const op_graph g = ab_graph();
  measured_table t;
  const json tr = json::parse(instrumented);
  add_profile(t, tr, precision::fp16, g);
  REQUIRE(t.find("a", precision::fp16)->forward_ms == Approx(0.010));
  REQUIRE(t.find("b", precision::fp16)->backward_ms == Approx(0.020));
  REQUIRE(t.find_host("a", precision::fp16)->forward_ms == Approx(0.150));
  REQUIRE(t.find_tail(precision::fp16)->gpu_ms == Approx(0.005));  // the optimizer kernel
  REQUIRE(t.find_tail(precision::fp16)->cpu_ms == Approx(0.880 - 0.350));
  REQUIRE(t.find_tail(precision::fp32) == nullptr);
  // With the plain trace: 80 us of instrumentation over 4 ranges, 20 us off each.
  measured_table u;
  const json pl = json::parse(plain);
  add_profile(u, tr, precision::fp16, g, &pl);
  REQUIRE(u.find_host("a", precision::fp16)->forward_ms == Approx(0.130));
  REQUIRE(u.find_host("b", precision::fp16)->forward_ms == Approx(0.090));
  REQUIRE(u.find_host("b", precision::fp16)->backward_ms == Approx(0.030));
  REQUIRE(u.find_host("a", precision::fp16)->backward_ms == Approx(0.020));
  REQUIRE(u.find_tail(precision::fp16)->cpu_ms == Approx(0.800 - 0.270));
  // 0.48 ms of excess over 0.35 ms of op ranges: the ops get nothing, the tail the rest.
  const json faster = json::parse(R"({"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 400, "pid": 1, "tid": 1}]})");
  measured_table v;
  add_profile(v, tr, precision::fp16, g, &faster);
  REQUIRE(v.find_host("a", precision::fp16)->forward_ms == 0.0);
  REQUIRE(v.find_tail(precision::fp16)->cpu_ms == Approx(0.400));
  // Uneven ranges: one cost per range, none below zero: (0.15 - c) + (0.11 - c) = 0.07.
  REQUIRE(detail::water_level({{0.15, 1}, {0.11, 1}, {0.05, 1}, {0.04, 1}}, 0.07) == Approx(0.095));
}

TEST_CASE("add_profile: each host phase loses its own instrumentation excess") {
  const op_graph g = ab_graph();
  const json tr = json::parse(instrumented);
  // Instrumented: forward from 0 to b.backward's start at 420, less the 40 us sync; the
  // backward from there to a.backward's end at 490.
  const trace_ranges r = read_trace_ranges(tr);
  REQUIRE(r.forward_host_ms == Approx(0.380));
  REQUIRE(r.backward_host_ms == Approx(0.070));
  // Timed without a profiler: 800 us of host, 300 of them forward and 60 backward.
  const json pl = json::parse(R"({"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 900, "pid": 1, "tid": 1},
    {"ph": "X", "cat": "user_annotation", "name": "qsync.forward", "ts": 0, "dur": 300, "pid": 1, "tid": 1},
    {"ph": "X", "cat": "user_annotation", "name": "qsync.backward", "ts": 300, "dur": 60, "pid": 1, "tid": 1},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "ts": 800, "dur": 100, "pid": 1, "tid": 1}]})");
  const trace_ranges q = read_trace_ranges(pl);
  REQUIRE(q.forward_host_ms == Approx(0.300));
  REQUIRE(q.backward_host_ms == Approx(0.060));
  measured_table u;
  add_profile(u, tr, precision::fp16, g, &pl);
  // Forward: 80 us of excess over a (150) and b (110), 40 each; backward: 10 over 50 and 40.
  REQUIRE(u.find_host("a", precision::fp16)->forward_ms == Approx(0.110));
  REQUIRE(u.find_host("b", precision::fp16)->forward_ms == Approx(0.070));
  REQUIRE(u.find_host("b", precision::fp16)->backward_ms == Approx(0.045));
  REQUIRE(u.find_host("a", precision::fp16)->backward_ms == Approx(0.035));
  REQUIRE(u.find_tail(precision::fp16)->cpu_ms == Approx(0.800 - 0.260));
  // A phase whose plain time exceeds the instrumented one keeps its ranges whole.
  const json slow_bwd = json::parse(R"({"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 800, "pid": 1, "tid": 1},
    {"ph": "X", "cat": "user_annotation", "name": "qsync.forward", "ts": 0, "dur": 300, "pid": 1, "tid": 1},
    {"ph": "X", "cat": "user_annotation", "name": "qsync.backward", "ts": 300, "dur": 100, "pid": 1, "tid": 1}]})");
  measured_table v;
  add_profile(v, tr, precision::fp16, g, &slow_bwd);
  REQUIRE(v.find_host("b", precision::fp16)->backward_ms == Approx(0.050));
  REQUIRE(v.find_host("a", precision::fp16)->forward_ms == Approx(0.110));
  REQUIRE(v.find_tail(precision::fp16)->cpu_ms == Approx(0.800 - 0.270));
}

// The code between the ops: "a" and "b" forward on the main thread with an add launched
// between them (at 170), a loss launched on the main thread after "b" (at 320), its
// backward on autograd's thread before "b.backward" (at 410), and the optimizer after the
// last op range (at 600), inside its own range.
const char* with_code = R"({"traceEvents": [
  {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 1000, "pid": 1, "tid": 1},
  {"ph": "X", "cat": "user_annotation", "name": "a", "ts": 100, "dur": 50, "pid": 1, "tid": 1},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 120, "dur": 5, "pid": 1, "tid": 1, "args": {"correlation": 1}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 170, "dur": 5, "pid": 1, "tid": 1, "args": {"correlation": 4}},
  {"ph": "X", "cat": "user_annotation", "name": "b", "ts": 200, "dur": 100, "pid": 1, "tid": 1},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 220, "dur": 5, "pid": 1, "tid": 1, "args": {"correlation": 5}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 320, "dur": 5, "pid": 1, "tid": 1, "args": {"correlation": 6}},
  {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: AddmmBackward0", "ts": 400, "dur": 80, "pid": 1, "tid": 2},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 410, "dur": 5, "pid": 1, "tid": 2, "args": {"correlation": 7}},
  {"ph": "X", "cat": "user_annotation", "name": "b.backward", "ts": 420, "dur": 30, "pid": 1, "tid": 2},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 430, "dur": 5, "pid": 1, "tid": 2, "args": {"correlation": 2}},
  {"ph": "X", "cat": "user_annotation", "name": "a.backward", "ts": 470, "dur": 20, "pid": 1, "tid": 2},
  {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "ts": 590, "dur": 30, "pid": 1, "tid": 1},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 600, "dur": 5, "pid": 1, "tid": 1, "args": {"correlation": 3}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "ts": 900, "dur": 80, "pid": 1, "tid": 1},
  {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 130, "dur": 10, "pid": 0, "tid": 7, "args": {"correlation": 1}},
  {"ph": "X", "cat": "kernel", "name": "add", "ts": 180, "dur": 7, "pid": 0, "tid": 7, "args": {"correlation": 4}},
  {"ph": "X", "cat": "kernel", "name": "gemm2", "ts": 230, "dur": 10, "pid": 0, "tid": 7, "args": {"correlation": 5}},
  {"ph": "X", "cat": "kernel", "name": "loss", "ts": 330, "dur": 30, "pid": 0, "tid": 7, "args": {"correlation": 6}},
  {"ph": "X", "cat": "kernel", "name": "loss_bwd", "ts": 415, "dur": 4, "pid": 0, "tid": 7, "args": {"correlation": 7}},
  {"ph": "X", "cat": "kernel", "name": "gemm_bwd", "ts": 440, "dur": 20, "pid": 0, "tid": 7, "args": {"correlation": 2}},
  {"ph": "X", "cat": "kernel", "name": "sgd", "ts": 610, "dur": 5, "pid": 0, "tid": 7, "args": {"correlation": 3}}
]})";

TEST_CASE("the code between the ops goes to the op range after it, not to the tail") {
  const op_graph g = ab_graph();
  const json tr = json::parse(with_code);
  // Without the graph nothing is attributed: every kernel outside a range is tail.
  const trace_ranges bare = read_trace_ranges(tr);
  REQUIRE(bare.code_gpu_ms.empty());
  REQUIRE(tail_ms(bare, g) == Approx(0.007 + 0.030 + 0.004 + 0.005));
  const trace_ranges r = read_trace_ranges(tr, &g);
  REQUIRE(r.dispatch_gap_ms == 0.0);                // no kernel waited in a queue here
  REQUIRE(r.code_gpu_ms.at("b") == Approx(0.007));  // the add, launched between a and b
  REQUIRE(r.code_kernels.at("b") == 1);
  // The loss (main thread, after b) and its backward (autograd's thread) precede the
  // first op range that starts after them: b.backward.
  REQUIRE(r.code_gpu_ms.at("b.backward") == Approx(0.034));
  REQUIRE(r.code_gpu_ms.count("a") == 0);
  REQUIRE(r.code_gpu_ms.count("a.backward") == 0);
  // The optimizer's kernel is inside a range that is not an op: the tail, alone.
  REQUIRE(tail_ms(r, g) == Approx(0.005));
  measured_table t;
  add_profile(t, tr, precision::bf16, g);
  REQUIRE(t.find_code("b", precision::bf16)->forward_ms == Approx(0.007));
  REQUIRE(t.find_code("b", precision::bf16)->backward_ms == Approx(0.034));
  REQUIRE(t.find_code("a", precision::bf16)->forward_ms == 0.0);
  REQUIRE(t.find_tail(precision::bf16)->gpu_ms == Approx(0.005));
  REQUIRE(t.find("b", precision::bf16)->forward_ms == Approx(0.010));  // its own kernel
}

TEST_CASE("the code between the ops runs under the host's time, not after it") {
  // Host-bound: four op halves of 1 ms of host time each, 0.01 ms of GPU time, and 0.8 ms
  // of code (a loss, say) before op1's forward. Issued after op0's host time, the code
  // runs 1.0 -> 1.8 while the host issues op1: the iteration is the host's 4 ms and the
  // tail's 0.5. As a tail, after the last op, it was 4.0 + 0.8 + 0.1.
  training_model m = model_of(linear_chain(2));
  device_group grp{round_device(), 1, {}};
  for (const char* n : {"op0", "op1"}) {
    grp.measured.set(n, precision::fp16, {0.01, 0.01});
    grp.measured.set_host(n, precision::fp16, {1.0, 1.0});
  }
  grp.measured.set_code("op1", precision::fp16, {0.8, 0.0});
  grp.measured.set_tail(precision::fp16, {0.1, 0.5});
  const simulator sim(m, {"one", {grp}, {"l", 1, 0}});
  const evaluation e = sim.evaluate(sim.uniform(precision::fp16));
  REQUIRE(e.iteration_ms() == Approx(4.5));
  std::size_t code = 0;
  for (const kernel& k : e.groups[0].trace.kernels) code += k.kind == kernel_kind::code;
  REQUIRE(code == 1);
  // GPU-bound, the code adds in full, as the tail did: op0 (issued at 1), 5 ms of code
  // before op1's forward, then op1 and the two backward halves, then the tail's 0.1.
  grp.measured.set_code("op1", precision::fp16, {5.0, 0.0});
  const simulator gpu(m, {"one", {grp}, {"l", 1, 0}});
  REQUIRE(gpu.evaluate(gpu.uniform(precision::fp16)).iteration_ms() ==
          Approx(1.0 + 0.01 + 5.0 + 0.01 + 0.01 + 0.01 + 0.1).epsilon(1e-9));
  // A mixed plan takes the code from the profile of its ambient precision (none at fp32
  // here: the nearest measured, fp16).
  REQUIRE(gpu.evaluate(gpu.uniform(precision::fp32)).groups[0].trace.kernels.size() == 5);
}

TEST_CASE("the CPU chain uses measured host times and the tail's host time") {
  training_model m = model_of(linear_chain(2));
  device_group grp{round_device(), 1, {}};
  for (const char* n : {"op0", "op1"}) {
    grp.measured.set(n, precision::fp32, {0.01, 0.01});
    grp.measured.set_host(n, precision::fp32, {1.0, 1.0});
  }
  grp.measured.set_tail(precision::fp32, {0.1, 0.5});
  const simulator sim(m, {"one", {grp}, {"l", 1, 0}});
  const evaluation e = sim.evaluate(sim.uniform(precision::fp32));
  // Host-bound: four ops of 1 ms each, then the tail's 0.5 ms of host time.
  REQUIRE(e.groups[0].timing.cpu_end == Approx(4.0));
  REQUIRE(e.iteration_ms() == Approx(4.5));
  // A long GPU tail still runs after everything else: the last kernel (issued at 4)
  // ends at 4.01, then 2 ms of tail.
  grp.measured.set_tail(precision::fp32, {2.0, 0.5});
  const simulator gpu(m, {"one", {grp}, {"l", 1, 0}});
  REQUIRE(gpu.evaluate(gpu.uniform(precision::fp32)).iteration_ms() == Approx(6.01));
}

TEST_CASE("the tail comes from the profile of the precision most parameter ops run at") {
  // The first op holds ten times the others' parameters (an embedding): counted in
  // parameters it would decide the tail alone; counted in ops, as the plan applier's
  // ambient precision is, it is one op of three.
  auto ops = linear_chain(3);
  ops[0].param_numel = 10 * ops[1].param_numel;
  device_group grp{round_device(), 1, {}};
  grp.measured.set_tail(precision::fp32, {3.0, 0});
  grp.measured.set_tail(precision::fp16, {1.0, 0});
  const simulator sim(model_of(ops), {"one", {grp}, {"l", 1, 0}});
  using P = precision;
  REQUIRE(sim.trace(0, {P::fp16, P::fp32, P::fp32}).tail_ms == Approx(3.0));
  REQUIRE(sim.trace(0, {P::fp32, P::fp16, P::fp16}).tail_ms == Approx(1.0));
  REQUIRE(sim.trace(0, {P::int8, P::int8, P::int8}).tail_ms == Approx(1.0));  // nearest measured
  REQUIRE(sim.dominant_precision({P::int8, P::fp32, P::int8}) == P::int8);
  REQUIRE(sim.dominant_precision({P::fp16, P::fp32, P::bf16}) == P::fp32);  // ties: higher
  const simulator none(model_of(ops), {"one", {{round_device(), 1, {}}}, {"l", 1, 0}});
  REQUIRE(none.trace(0, {P::fp32, P::fp32, P::fp32}).tail_ms ==
          Approx(none.costs(0).optimizer_ms(none.graph().total_params(), 0)));
}

TEST_CASE("casts an autocast profile holds are not counted again") {
  auto ops = linear_chain(2);
  ops[0].stats.input_numel = 1000;
  device_profile d = round_device();
  d.casts = t4_cast_costs();
  auto casts = [](const device_trace& t) {
    int n = 0;
    for (const kernel& k : t.kernels) n += k.kind == kernel_kind::cast ? 1 : 0;
    return n;
  };
  const std::vector<precision> fp16(2, precision::fp16);
  const simulator roofline(model_of(ops), {"one", {{d, 1, {}}}, {"l", 1, 0}});
  // Unmeasured: the graph input, two weights forward and two weight gradients back.
  REQUIRE(casts(roofline.trace(0, fp16)) == 5);
  device_group grp{d, 1, {}};
  for (const char* n : {"op0", "op1"}) grp.measured.set(n, precision::fp16, {0.5, 1.0});
  const simulator measured(model_of(ops), {"one", {grp}, {"l", 1, 0}});
  REQUIRE(casts(measured.trace(0, fp16)) == 0);
  // A precision change between ops is not in a uniform profile: its casts stay.
  REQUIRE(casts(measured.trace(0, {precision::fp16, precision::fp32})) == 2);
}

TEST_CASE("memory counts autocast's weight copies, measured saved bytes and the workspace") {
  auto ops = linear_chain(2);
  ops[1].saved_bytes[index_of(precision::fp16)] = 123;
  device_profile d = round_device();
  d.workspace_mib = 1;
  const simulator sim(model_of(ops), {"one", {{d, 1, {}}}, {"l", 1, 0}});
  using P = precision;
  const memory_breakdown m = sim.evaluate(sim.uniform(P::fp16)).groups[0].memory;
  REQUIRE(m.weight_copies == 2 * 1000 * 2);
  REQUIRE(m.activations == 1000 * 2 + 123);
  // Backward starts at op1 (its 1000 outputs' gradients twice at 2 bytes, nothing freed);
  // at op0 op1's 123 saved bytes and 2000 bytes of weight copy are gone.
  REQUIRE(m.workspace == 1024 * 1024 + 2 * 1000 * 2);
  auto wide = ops;
  wide[0].output_numel = 10000;  // op0's pair (40000 B), with what op1 freed (2123 B) gone
  const simulator w(model_of(wide), {"one", {{d, 1, {}}}, {"l", 1, 0}});
  const memory_breakdown mw = w.evaluate(w.uniform(P::fp16)).groups[0].memory;
  REQUIRE(mw.workspace == 1024 * 1024 + 40000);
  REQUIRE(mw.total() ==
          mw.weights + mw.optimizer + 1024 * 1024 + (8000 + (2000 + 123 + 4000 - 2123) + 40000));
  op norm = linear_op("ln", {});
  norm.kind = op_kind::layer_norm;
  const simulator n(model_of({norm}), {"one", {{d, 1, {}}}, {"l", 1, 0}});
  REQUIRE(n.evaluate(n.uniform(P::fp16)).groups[0].memory.weight_copies == 0);
  const memory_breakdown f = sim.evaluate(sim.uniform(P::fp32)).groups[0].memory;
  REQUIRE(f.weight_copies == 0);
  REQUIRE(f.activations == 2 * 1000 * 4);
}

TEST_CASE("bf16 is on the menu of every GPU that has it") {
  using P = precision;
  for (const auto& dev : {a100(), h100(), h200()}) {
    const auto& m = dev.precisions;
    REQUIRE(std::find(m.begin(), m.end(), P::bf16) != m.end());
  }
  for (const auto& dev : {t4(), v100()}) {
    const auto& m = dev.precisions;
    REQUIRE(std::find(m.begin(), m.end(), P::bf16) == m.end());
  }
  // Two cuBLAS workspaces (forward's thread, backward's) and cuBLASLt's MiB.
  REQUIRE(h200().workspace_mib == 65);
  REQUIRE(t4().workspace_mib == 17.25);
  REQUIRE(builtin_cluster("H200").world_size() == 1);
}

TEST_CASE("several traces per device group, one per precision") {
  const training_model m = model_from_json(read_json_file(data_dir + "/qsync_tiny_model.json"));
  const auto list =
      parse_profile_list("fp32=qsync_tiny_trace.json,fp16=qsync_tiny_trace_fp16.json");
  REQUIRE(list.size() == 2);
  REQUIRE(list[1].p == precision::fp16);
  REQUIRE_THROWS_WITH(parse_profile_list("fp32"), Contains("expected PRECISION=FILE"));
  REQUIRE_THROWS_WITH(parse_profile_list("fp4=a.json"), Contains("unknown precision 'fp4'"));
  const json cj = json::parse(R"({"link": "nvlink4", "groups": [{"device": "H200",
      "trace": ["fp32=qsync_tiny_trace.json",
                {"precision": "fp16", "file": "qsync_tiny_trace_fp16.json"}]}]})");
  const cluster c = cluster_from_json(cj, m.graph, data_dir);
  const measured_table& t = c.groups[0].measured;
  REQUIRE(t.find("fc1", precision::fp32)->forward_ms == Approx(0.140));  // 130 us + a 10 us gap
  REQUIRE(t.find("fc1", precision::fp16)->forward_ms == Approx(0.085));  // 65 + a 20 us gap
  REQUIRE(t.find_tail(precision::fp16) != nullptr);
  REQUIRE(t.find_host("fc1", precision::fp32) != nullptr);
  auto twice = list;
  twice[1].p = precision::fp32;
  measured_table u;
  REQUIRE_THROWS_WITH(load_profiles(u, twice, m.graph, data_dir), Contains("two traces for fp32"));
  auto paired = list;
  add_plain_traces(paired, "fp16=x.json");
  REQUIRE(paired[1].plain == "x.json");
  REQUIRE_THROWS_WITH(add_plain_traces(paired, "bf16=x.json"), Contains("no trace at that"));
}

TEST_CASE("a given plan is read, resolved and predicted") {
  const training_model m = model_from_json(read_json_file(data_dir + "/qsync_tiny_model.json"));
  const simulator sim(m, builtin_cluster("H200"));
  using P = precision;
  const plan p = plan_from_json(sim, read_json_file(data_dir + "/qsync_tiny_plan.json"));
  REQUIRE(p.precisions[0] == std::vector<P>{P::fp16, P::fp16, P::fp32});  // relu follows fc1
  REQUIRE(p.bucket_bits == std::vector<int>(sim.buckets().size(), 32));
  const plan q = plan_from_json(sim, json::parse(R"({"default": "bf16", "bucket_bits": [8]})"));
  REQUIRE(q == sim.uniform(P::bf16, 8));
  REQUIRE_THROWS_WITH(plan_from_json(sim, json::parse(R"({"ops": {"fc9": "fp16"}})")),
                      Contains("unknown op 'fc9'"));
  REQUIRE_THROWS_WITH(plan_from_json(sim, json::parse(R"({"ops": {"fc1": "int8"}})")),
                      Contains("op 'fc1' cannot run at int8 on H200"));
  REQUIRE_THROWS_WITH(plan_from_json(sim, json::parse(R"({"bucket_bits": [8, 8]})")),
                      Contains("2 bucket widths"));
  const auto j = evaluation_to_json(sim, "given", sim.evaluate(p));
  REQUIRE(j["groups"][0]["memory"]["weight_copies"].get<double>() > 0);
  REQUIRE(j["iteration_ms"].get<double>() == Approx(sim.evaluate(p).iteration_ms()));
}

#if !defined(LOWBIT_QSYNC_WITH_ZLIB)
#error "the real-trace test reads gzipped traces: build it with zlib (test/qsync/CMakeLists.txt)"
#endif
TEST_CASE("a real PyTorch 2.11 trace (CPU, gzipped): ranges per op, host times, the tail") {
  // examples/pytorch/qsync/make_test_traces.py: a 3-layer MLP (ops "0", "1", "2"), two
  // profiled steps with ranges, two without. On the CPU autograd runs on the main thread
  // and there are no kernels: GPU times are 0, host times are what is checked.
  const training_model m = model_from_json(read_json_file(data_dir + "/qsync_real_cpu_model.json"));
  REQUIRE(m.graph.size() == 3);
  REQUIRE(m.graph.at(1).inputs == std::vector<std::string>{"0"});
  const json trace = read_json_file(data_dir + "/qsync_real_cpu_trace.json.gz");
  const json plain = read_json_file(data_dir + "/qsync_real_cpu_plain.json.gz");
  const trace_ranges r = read_trace_ranges(trace);
  REQUIRE(r.iterations == 2);
  for (const char* n : {"0", "1", "2", "0.backward", "1.backward", "2.backward"})
    REQUIRE(r.occurrences.at(n) == 2);
  // The expected times from the trace's events by the definitions (host_times_by_hand):
  // about 85.8 ms per step; "0" from the end of the optimizer's zero_grad range before it
  // (about 7.5 ms); "2.backward" from the end of "2" (the loss and its backward in
  // between are host time of the first backward: about 54.2 ms).
  const host_times want = host_times_by_hand(trace);
  REQUIRE(want.steps == 2);
  REQUIRE(r.host_ms == Approx(want.host_ms));
  REQUIRE(want.cpu_ms.size() == 8);  // the 6 op ranges, zero_grad and step
  for (const auto& [name, ms] : want.cpu_ms) {
    INFO(name);
    REQUIRE(r.cpu_ms.at(name) == Approx(ms));
  }
  measured_table t;
  const auto skipped = add_profile(t, trace, precision::fp32, m.graph, &plain);
  REQUIRE(std::find(skipped.begin(), skipped.end(), "Optimizer.step#SGD.step") != skipped.end());
  const tail_time* tail = t.find_tail(precision::fp32);
  REQUIRE(tail != nullptr);
  REQUIRE(tail->gpu_ms == Approx(0.0));
  double ops = 0;
  for (const char* n : {"0", "1", "2"}) {
    REQUIRE(t.find(n, precision::fp32)->forward_ms == 0.0);  // measured: no kernels
    ops +=
        t.find_host(n, precision::fp32)->forward_ms + t.find_host(n, precision::fp32)->backward_ms;
  }
  const double h_plain = read_trace_ranges(plain).host_ms;
  REQUIRE(h_plain == Approx(host_times_by_hand(plain).host_ms));  // about 64.0 ms
  REQUIRE(tail->cpu_ms >= 0);
  REQUIRE(ops + tail->cpu_ms == Approx(h_plain));  // the plain host time, split
}
