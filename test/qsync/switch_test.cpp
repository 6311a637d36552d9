// What a precision switch costs under lowbit's plan applier: its edge casts' GPU time from
// the device's cast fit, their host time forward and backward, and the wrapped ops' own
// host time forward (hooks) and backward.
#include <catch2/catch.hpp>

#include <vector>

#include <nlohmann/json.hpp>

#include "lowbit/qsync/plan_io.hpp"
#include "lowbit/qsync/simulator.hpp"
#include "qsync_fixtures.hpp"

using namespace lowbit::qsync;
using namespace lowbit::qsync::test;
using P = precision;

namespace {

// A chain of linears measured at fp16 and fp32 (so no weight casts), each half taking
// `host` ms of host time and `gpu` ms of GPU time, with a tail at both precisions.
simulator measured_chain(std::vector<op> ops, const device_profile& d, double host, double gpu,
                         cast_rule rule = cast_rule::ambient) {
  training_model m = model_of(ops);
  m.casts = rule;
  device_group grp{d, 1, {}};
  for (const op& o : ops)
    for (P p : {P::fp16, P::fp32}) {
      grp.measured.set(o.name, p, {gpu, gpu});
      grp.measured.set_host(o.name, p, {host, host});
    }
  for (P p : {P::fp16, P::fp32}) grp.measured.set_tail(p, {0.1, 0.5});
  return simulator(m, {"one", {grp}, {"l", 1, 0}});
}

device_profile with_switch_costs(device_profile d, double fwd, double bwd, double wrap,
                                 double wrap_backward = 0.0, double mode_call = 0.0) {
  d.switches = {fwd, bwd, wrap, wrap_backward, mode_call};
  return d;
}

double iteration(const simulator& sim, const std::vector<P>& p) {
  plan pl;
  pl.precisions = {sim.resolve(0, p)};
  pl.bucket_bits.assign(sim.buckets().size(), 32);
  return sim.evaluate(pl).iteration_ms();
}

}  // namespace

TEST_CASE("switch: defaults price an edge cast's host time as one launch, hooks at nothing") {
  const device_profile h = h200();
  REQUIRE(h.cast_host_ms(false) == h.launch_ms);
  REQUIRE(h.cast_host_ms(true) == h.launch_ms);
  REQUIRE(h.switches.wrap_ms == 0.0);
  const device_profile m = with_switch_costs(h, 0.03, 0.02, 0.05);
  REQUIRE(m.cast_host_ms(false) == 0.03);
  REQUIRE(m.cast_host_ms(true) == 0.02);
}

TEST_CASE("switch: a host-bound mixed plan grows by exactly its casts' and hooks' host time") {
  device_profile d = round_device();
  d.casts.float_to_float = {0.0, 1e-3};
  const double fwd = 0.03, bwd = 0.02, wrap = 0.05;
  const auto ops = linear_chain(5);
  const simulator base = measured_chain(ops, d, 1.0, 0.01);
  const simulator priced = measured_chain(ops, with_switch_costs(d, fwd, bwd, wrap), 1.0, 0.01);
  // Uniform plans wrap nothing and cast nothing: unchanged.
  for (P u : {P::fp16, P::fp32}) {
    const std::vector<P> all(5, u);
    REQUIRE(iteration(priced, all) == iteration(base, all));
  }
  // op2 at fp16 in an fp32 step: the applier wraps op2 (off the ambient) and op3 (fed by
  // it); forward it casts op2's input and op2's output to the ambient (op3 reads it),
  // backward both gradients back.
  const std::vector<P> mixed = {P::fp32, P::fp32, P::fp16, P::fp32, P::fp32};
  REQUIRE(priced.wrapped_ops(mixed, P::fp32) == std::vector<bool>{false, false, true, true, false});
  REQUIRE(iteration(priced, mixed) - iteration(base, mixed) ==
          Approx(2 * wrap + 2 * fwd + 2 * bwd).epsilon(1e-12));
  std::vector<double> cast_host;
  for (const kernel& k : priced.trace(0, mixed).kernels)
    if (k.kind == kernel_kind::cast) cast_host.push_back(k.cpu_ms);
  REQUIRE(cast_host == std::vector<double>{fwd, fwd, bwd, bwd});
  // A wrapped op's backward cost beyond its casts: on the backward kernels of the two
  // wrapped ops, and nowhere in a uniform plan.
  const double wrap_bwd = 0.007;
  const simulator both =
      measured_chain(ops, with_switch_costs(d, fwd, bwd, wrap, wrap_bwd), 1.0, 0.01);
  REQUIRE(iteration(both, mixed) - iteration(priced, mixed) == Approx(2 * wrap_bwd).epsilon(1e-12));
  for (const kernel& k : both.trace(0, mixed).kernels)
    if (k.kind == kernel_kind::backward)
      REQUIRE(k.cpu_ms == Approx(1.0 + (k.op == 2 || k.op == 3 ? wrap_bwd : 0.0)));
  REQUIRE(iteration(both, std::vector<P>(5, P::fp32)) ==
          iteration(base, std::vector<P>(5, P::fp32)));
  // A wrapped function op's torch calls the applier's mode checks: op2 (wrapped) makes 6,
  // op1 (not wrapped) 4: only op2's are priced, on its forward kernel.
  auto fn_ops = ops;
  fn_ops[1].mode_calls = 4;
  fn_ops[2].mode_calls = 6;
  const double per_call = 0.002;
  const simulator moded =
      measured_chain(fn_ops, with_switch_costs(d, fwd, bwd, wrap, 0.0, per_call), 1.0, 0.01);
  REQUIRE(iteration(moded, mixed) - iteration(priced, mixed) ==
          Approx(6 * per_call).epsilon(1e-12));
  // The same plan without the applier (QSync's per-edge casts) wraps nothing: the casts'
  // host time alone.
  const simulator edge = measured_chain(ops, d, 1.0, 0.01, cast_rule::per_edge);
  const simulator edge_priced =
      measured_chain(ops, with_switch_costs(d, fwd, bwd, wrap), 1.0, 0.01, cast_rule::per_edge);
  REQUIRE(iteration(edge_priced, mixed) - iteration(edge, mixed) ==
          Approx(2 * fwd + 2 * bwd).epsilon(1e-12));
}

TEST_CASE("switch: a GPU-bound mixed plan grows by its casts' GPU time from the device's fit") {
  device_profile d = round_device();
  d.casts.float_to_float = {1e-6, 2e-3};  // 1000 elements: 0.003 ms a cast
  const auto ops = linear_chain(5);
  const simulator sim = measured_chain(ops, with_switch_costs(d, 0.03, 0.02, 0.05), 0.0, 1.0);
  const std::vector<P> mixed = {P::fp32, P::fp32, P::fp16, P::fp32, P::fp32};
  const std::vector<P> fp32(5, P::fp32);
  // Four casts of op outputs (1000 elements), two forward and two backward; the host
  // time of the switch hides under the GPU's.
  REQUIRE(iteration(sim, mixed) - iteration(sim, fp32) == Approx(4 * 0.003).epsilon(1e-12));
}

TEST_CASE("switch: a layer norm at fp32 among 16-bit ops costs its hooks, not casts") {
  device_profile d = round_device();
  d.casts.float_to_float = {0.0, 1e-3};
  auto ops = linear_chain(3);
  ops[1].kind = op_kind::layer_norm;
  const double fwd = 0.03, bwd = 0.02, wrap = 0.05;
  const simulator base = measured_chain(ops, d, 1.0, 0.01);
  const simulator priced = measured_chain(ops, with_switch_costs(d, fwd, bwd, wrap), 1.0, 0.01);
  // Ambient fp16: the norm is wrapped (off the ambient), op2 too (fed by fp32); autocast
  // runs the norm at fp32 anyway, so its casts are in its neighbours' profiles.
  const std::vector<P> mixed = {P::fp16, P::fp32, P::fp16};
  REQUIRE(priced.wrapped_ops(mixed, P::fp16) == std::vector<bool>{false, true, true});
  REQUIRE(iteration(priced, mixed) - iteration(base, mixed) == Approx(2 * wrap).epsilon(1e-12));
}

TEST_CASE("switch: cast fits and switch host times from device JSON") {
  const auto j = nlohmann::json::parse(R"({"base": "H200",
      "cast_fits": {"float_to_float": {"a_ms": 1.5e-9, "b_ms": 0.0025}},
      "cast_host_ms": 0.031, "cast_backward_host_ms": 0.012, "wrap_host_ms": 0.044,
      "wrap_backward_host_ms": 0.017, "function_call_host_ms": 0.004})");
  const device_profile d = device_from_json(j);
  REQUIRE(d.casts.float_to_float.a_ms == 1.5e-9);
  REQUIRE(d.casts.float_to_float.b_ms == 0.0025);
  REQUIRE(d.casts.quantize.a_ms == h200().casts.quantize.a_ms);  // not given: kept
  REQUIRE(d.cast_host_ms(false) == 0.031);
  REQUIRE(d.cast_host_ms(true) == 0.012);
  REQUIRE(d.switches.wrap_ms == 0.044);
  REQUIRE(d.switches.wrap_backward_ms == 0.017);
  REQUIRE(d.switches.mode_call_ms == 0.004);
  // switch_probe.py's "device" object applies to a built-in device as it is.
  device_profile h = h200();
  apply_device_fields(h, j);
  REQUIRE(h.switches.wrap_ms == 0.044);
  REQUIRE(h.name == "H200");
  REQUIRE_THROWS_WITH(device_from_json(nlohmann::json::parse(
                          R"({"base": "H200", "cast_fits": {"fp8": {"a_ms": 1}}})")),
                      Catch::Contains("unknown fit 'fp8'"));
  REQUIRE_THROWS_WITH(device_from_json(nlohmann::json::parse(
                          R"({"base": "H200", "wrap_backward_host_ms": -0.01})")),
                      Catch::Contains("must be >= 0"));
}

TEST_CASE("switch: fp8 ops take and give bf16, so a bf16 step casts nothing around them") {
  // op0 (fp8) -> act (parameter-free) -> op1 (fp8) -> mid (bf16) -> op2 (fp8), measured
  // at every precision: the fp8 GEMMs cast their operands inside their own measured time
  // and hand on bf16, so the step prices no cast, and the activation runs at bf16.
  device_profile d = round_device();
  d.peak_tflops[index_of(P::fp8)] = 4;
  d.peak_tflops[index_of(P::bf16)] = 2;
  d.precisions = {P::fp8, P::bf16, P::fp32};
  d.casts.float_to_float = {1e-6, 1e-3};
  d.casts.quantize = d.casts.dequantize = {1e-5, 1e-2};
  std::vector<op> ops = linear_chain(3);
  op act;
  act.name = "act";
  act.kind = op_kind::gelu;
  act.inputs = {"op0"};
  act.output_numel = 1000;
  ops[1].inputs = {"act"};
  op mid = linear_op("mid", {"op1"});
  mid.kind = op_kind::other;  // not one autocast keeps at fp32: its casts are priced
  ops[2].inputs = {"mid"};
  ops.insert(ops.begin() + 1, act);
  ops.insert(ops.begin() + 3, mid);  // op0, act, op1, mid, op2
  training_model m = model_of(ops);
  m.casts = cast_rule::ambient;
  device_group grp{d, 1, {}};
  for (const op& o : ops)
    for (P p : {P::fp8, P::fp16, P::bf16, P::fp32}) grp.measured.set(o.name, p, {1.0, 1.0});
  for (P p : {P::fp8, P::bf16, P::fp32}) grp.measured.set_tail(p, {0.1, 0.0});
  const simulator sim(m, {"one", {grp}, {"l", 1, 0}});
  const std::vector<P> plan = {P::fp8, P::fp32, P::fp8, P::bf16, P::fp8};
  const std::vector<P> resolved = sim.resolve(0, plan);
  REQUIRE(resolved[1] == P::bf16);  // the follower of an fp8 op runs at what it carries
  for (const kernel& k : sim.trace(0, resolved).kernels) REQUIRE(k.kind != kernel_kind::cast);
  // mid at fp32 instead: its input and output are cast from and to bf16, not fp8.
  const std::vector<P> fp32_mid = sim.resolve(0, {P::fp8, P::fp32, P::fp8, P::fp32, P::fp8});
  int casts = 0;
  for (const kernel& k : sim.trace(0, fp32_mid).kernels)
    if (k.kind == kernel_kind::cast) {
      ++casts;
      REQUIRE(k.gpu_ms == Approx(d.casts.float_to_float.at(1000)));
    }
  REQUIRE(casts == 4);  // into and out of mid, forward and backward
}

TEST_CASE(
    "switch: fp8 ops' measured host time holds their hooks; a bf16 op fed by one is wrapped") {
  // A host-bound chain of linears measured at fp8 and bf16. The applier's ambient under a
  // plan of mostly fp8 is bf16, so it wraps every fp8 op (in the uniform fp8 profile too:
  // their host time there holds the hooks) and a bf16 op with parameters fed by an fp8 op.
  device_profile d = round_device();
  d.peak_tflops[index_of(P::fp8)] = 4;
  d.peak_tflops[index_of(P::bf16)] = 2;
  d.precisions = {P::fp8, P::bf16, P::fp32};
  const double wrap = 0.05;
  const auto ops = linear_chain(4);
  const auto chain = [&](double hooks) {
    training_model m = model_of(ops);
    m.casts = cast_rule::ambient;
    device_group grp{with_switch_costs(d, 0.0, 0.0, hooks), 1, {}};
    for (const op& o : ops)
      for (P p : {P::fp8, P::bf16, P::fp32}) {
        grp.measured.set(o.name, p, {0.01, 0.01});
        grp.measured.set_host(o.name, p, {1.0, 1.0});
      }
    for (P p : {P::fp8, P::bf16, P::fp32}) grp.measured.set_tail(p, {0.1, 0.5});
    return simulator(m, {"one", {grp}, {"l", 1, 0}});
  };
  const simulator base = chain(0.0), priced = chain(wrap);
  const std::vector<P> fp8(4, P::fp8);
  REQUIRE(priced.wrapped_ops(fp8, P::bf16) == std::vector<bool>(4, true));
  REQUIRE(iteration(priced, fp8) == iteration(base, fp8));  // in the profile already
  // op2 at bf16, the ambient: wrapped (fed by fp8 op1), op3 (fp8, fed by bf16) as always.
  const std::vector<P> one_bf16 = {P::fp8, P::fp8, P::bf16, P::fp8};
  REQUIRE(priced.wrapped_ops(one_bf16, P::bf16) == std::vector<bool>(4, true));
  REQUIRE(iteration(priced, one_bf16) - iteration(base, one_bf16) == Approx(wrap).epsilon(1e-12));
  // A bf16 plan with one fp8 op: that op is wrapped and its profile holds it; op2 (bf16 fed
  // by it) is wrapped and priced.
  const std::vector<P> one_fp8 = {P::bf16, P::fp8, P::bf16, P::bf16};
  REQUIRE(priced.wrapped_ops(one_fp8, P::bf16) == std::vector<bool>{false, true, true, false});
  REQUIRE(iteration(priced, one_fp8) - iteration(base, one_fp8) == Approx(wrap).epsilon(1e-12));
}

TEST_CASE("switch: an op without a backward costs nothing there, measured or not") {
  std::vector<op> ops = linear_chain(2);
  op id;
  id.name = "identity";
  id.inputs = {"op0"};
  id.output_numel = 1e6;
  id.bytes = 8e6;
  ops[1].inputs = {"identity"};
  ops.insert(ops.begin() + 1, id);
  const cost_model plain(round_device());
  REQUIRE(plain.time(ops[1], P::fp32).backward_ms > 0);  // the roofline's copy
  ops[1].has_backward = false;
  REQUIRE(plain.time(ops[1], P::fp32).backward_ms == 0.0);
  REQUIRE(plain.host_time(ops[1], P::fp32).backward_ms == 0.0);
  REQUIRE(plain.time(ops[1], P::fp32).forward_ms > 0);
  // from a model JSON: "backward": false
  const training_model m = model_from_json(nlohmann::json::parse(R"({"ops": [
      {"name": "a", "kind": "linear", "param_numel": 10},
      {"name": "b", "inputs": ["a"], "backward": false, "mode_calls": 7}]})"));
  REQUIRE(m.graph.at(0).has_backward);
  REQUIRE_FALSE(m.graph.at(1).has_backward);
  REQUIRE(m.graph.at(0).mode_calls == 0.0);
  REQUIRE(m.graph.at(1).mode_calls == 7.0);
  REQUIRE_THROWS_WITH(
      model_from_json(nlohmann::json::parse(R"({"ops": [{"name": "a", "mode_calls": -1}]})")),
      Catch::Contains("\"mode_calls\" must be >= 0"));
}

TEST_CASE("switch: a parameter-free op fed by no op runs in the step's context, not wrapped") {
  // A detection model's input transform, a Flatten in front: no op before it. Through the
  // ambient it runs where the uniform profiles ran it, so a uniform plan wraps nothing and
  // prices no cast; per edge (QSync's rule) it is fp32.
  std::vector<op> ops = linear_chain(2);
  op front;
  front.name = "transform";
  front.output_numel = 1000;
  ops[0].inputs = {"transform"};
  ops.insert(ops.begin(), front);  // transform, op0, op1
  for (cast_rule rule : {cast_rule::ambient, cast_rule::per_edge}) {
    training_model m = model_of(ops);
    m.casts = rule;
    device_group grp{round_device(), 1, {}};
    for (const op& o : ops)
      for (P p : {P::fp16, P::fp32}) grp.measured.set(o.name, p, {1.0, 1.0});
    for (P p : {P::fp16, P::fp32}) grp.measured.set_tail(p, {0.1, 0.0});
    const simulator sim(m, {"one", {grp}, {"l", 1, 0}});
    const std::vector<P> resolved = sim.resolve(0, {P::fp32, P::fp16, P::fp16});
    if (rule == cast_rule::ambient) {
      REQUIRE(resolved[0] == P::fp16);
      REQUIRE(sim.wrapped_ops(resolved, P::fp16) == std::vector<bool>{false, false, false});
      for (const kernel& k : sim.trace(0, resolved).kernels) REQUIRE(k.kind != kernel_kind::cast);
      // an fp32 plan: the step's context is fp32
      REQUIRE(sim.resolve(0, {P::fp16, P::fp32, P::fp32})[0] == P::fp32);
    } else {
      REQUIRE(resolved[0] == P::fp32);
    }
  }
}
