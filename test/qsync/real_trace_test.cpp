// The trace loader on real GPU traces: one H200, PyTorch 2.11.0+cu130, the ResNet-18-like
// CNN of examples/pytorch/qsync/validate.py at batch 256 (cnn-b256), fp32 and bf16
// profiles with per-op ranges, cut to their middle profiler step by
// examples/pytorch/qsync/trim_trace.py, and the host time validate.py measured without a
// profiler. One compute stream; the backward ranges run on autograd's thread.
//
// The expected figures were computed independently of the loader by a Python one-off
// over the same gzipped files: per range, the sum of the `kernel` events' `dur` whose
// `args.correlation` is that of a `cuda_runtime`/`cuda_driver` event on the range's
// thread starting inside the range; the tail as all kernel time less that of the ranges
// naming an op of the model JSON (forward and `.backward`); the step's host time as the
// ProfilerStep duration less the cudaDeviceSynchronize inside it; a range's host time
// from the end of the previous range on its thread less synchronising calls.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "lowbit/qsync/plan_io.hpp"
#include "lowbit/qsync/trace_loader.hpp"

using namespace lowbit::qsync;
using json = nlohmann::json;

namespace {
const std::string data_dir = LOWBIT_TEST_DATA_DIR;
}  // namespace

#if !defined(LOWBIT_QSYNC_WITH_ZLIB)
#error "the real-trace tests read gzipped traces: build them with zlib (test/qsync/CMakeLists.txt)"
#endif

TEST_CASE("a real H200 trace (fp32, gzipped): kernels by correlation id, tail, host times") {
  const training_model m = model_from_json(read_json_file(data_dir + "/qsync_h200_cnn_model.json"));
  REQUIRE(m.graph.size() == 60);  // leaf-module calls, a shared ReLU twice per block
  const json trace = read_json_file(data_dir + "/qsync_h200_cnn_fp32_trace.json.gz");
  const trace_ranges r = read_trace_ranges(trace);
  REQUIRE(r.iterations == 1);
  // 382 kernels, each matched to its launch by correlation id.
  REQUIRE(r.kernel_ms == Approx(47.292503));
  // The device's dispatch gap: the median of 279 idle spells before queued kernels.
  REQUIRE(r.dispatch_gap_ms == Approx(0.0013115234375));
  // 1.306426 ms of the 25 kernels outside the ops' ranges, and their 25 gaps.
  REQUIRE(tail_ms(r, m.graph) == Approx(1.306426 + 25 * 0.0013115234375));
  REQUIRE(r.gpu_ms.at("conv1") == Approx(2.451801));
  REQUIRE(r.gpu_ms.at("conv1.backward") == Approx(2.005786));  // autograd's thread
  REQUIRE(r.gpu_ms.at("layers.0.conv1") == Approx(0.483807));
  REQUIRE(r.gpu_ms.at("layers.0.conv1.backward") == Approx(1.313402));
  REQUIRE(r.gpu_ms.at("layers.0.relu#2") == Approx(0.097408));  // a shared module's 2nd call
  REQUIRE(r.gpu_ms.at("layers.0.relu#2.backward") == Approx(0.142240));
  REQUIRE(r.gpu_ms.at("fc.backward") == Approx(0.032416));
  // 59.84 ms of ProfilerStep less the 19.46 ms final cudaDeviceSynchronize.
  REQUIRE(r.host_ms == Approx(40.378320));
  // conv1 from the end of the optimizer's zero_grad range before it.
  REQUIRE(r.cpu_ms.at("conv1") == Approx(0.790745));

  // With the host time measured without a profiler (13.077 ms) the instrumentation's
  // excess comes off the op ranges: ops and tail add up to it.
  const json host = read_json_file(data_dir + "/qsync_h200_cnn_fp32_host.json.gz");
  measured_table t;
  const auto skipped = add_profile(t, trace, precision::fp32, m.graph, &host);
  REQUIRE(std::find(skipped.begin(), skipped.end(), "Optimizer.zero_grad#Adam.zero_grad") !=
          skipped.end());
  double ops = 0;
  for (const op& o : m.graph.ops()) {
    const op_time* h = t.find_host(o.name, precision::fp32);
    REQUIRE(h != nullptr);
    ops += h->forward_ms + std::max(0.0, h->backward_ms);
  }
  const tail_time* tail = t.find_tail(precision::fp32);
  REQUIRE(tail != nullptr);
  // The 25 kernels outside the ranges are now the code between the ops (residual adds,
  // flatten, the loss) before the range after them, and the optimizer after the last.
  double code = 0;
  for (const op& o : m.graph.ops()) {
    const op_time* c = t.find_code(o.name, precision::fp32);
    REQUIRE(c != nullptr);
    code += c->forward_ms + c->backward_ms;
  }
  REQUIRE(tail->gpu_ms + code == Approx(1.306426 + 25 * 0.0013115234375));
  WARN("fp32: code between the ops " << code << " ms, tail " << tail->gpu_ms << " ms");
  REQUIRE(ops + tail->cpu_ms == Approx(13.0774645).epsilon(1e-6));
  // conv1's 2.451801 ms of kernels, four of them, each with its dispatch gap.
  REQUIRE(t.find("conv1", precision::fp32)->forward_ms == Approx(2.451801 + 4 * 0.0013115234375));
}

TEST_CASE("a real H200 trace (bf16, gzipped) is a second profile of the same group") {
  const training_model m = model_from_json(read_json_file(data_dir + "/qsync_h200_cnn_model.json"));
  const json trace = read_json_file(data_dir + "/qsync_h200_cnn_bf16_trace.json.gz");
  const trace_ranges r = read_trace_ranges(trace);
  REQUIRE(r.iterations == 1);
  REQUIRE(r.kernel_ms == Approx(44.831928));  // 470 kernels
  REQUIRE(r.dispatch_gap_ms == Approx(0.001248046875));
  REQUIRE(tail_ms(r, m.graph) == Approx(0.727867 + 27 * 0.001248046875));  // 27 kernels
  REQUIRE(r.gpu_ms.at("conv1") == Approx(2.540763));
  REQUIRE(r.gpu_ms.at("layers.0.conv1.backward") == Approx(0.643359));
  REQUIRE(r.host_ms == Approx(29.565700));
  REQUIRE(r.cpu_ms.at("conv1") == Approx(0.832092));
  measured_table t;
  add_profile(t, read_json_file(data_dir + "/qsync_h200_cnn_fp32_trace.json.gz"), precision::fp32,
              m.graph);
  add_profile(t, trace, precision::bf16, m.graph);
  REQUIRE(t.find("conv1", precision::fp32)->forward_ms == Approx(2.451801 + 4 * 0.0013115234375));
  REQUIRE(t.find("conv1", precision::bf16)->forward_ms == Approx(2.540763 + 6 * 0.001248046875));
  // The 27 kernels outside the ranges: 0.64 ms of them are code between the ops (the
  // residual adds, flatten, the loss and their backward), priced before the op after
  // them; the rest, after the last op, the fused optimizer step: the tail.
  double code = 0;
  for (const op& o : m.graph.ops()) {
    const op_time* c = t.find_code(o.name, precision::bf16);
    REQUIRE(c != nullptr);
    code += c->forward_ms + c->backward_ms;
  }
  const double tail = t.find_tail(precision::bf16)->gpu_ms;
  REQUIRE(tail + code == Approx(0.727867 + 27 * 0.001248046875));
  REQUIRE(tail == Approx(0.1186551406));
  WARN("bf16: code between the ops " << code << " ms, tail " << tail << " ms");
}
