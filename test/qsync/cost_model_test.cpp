#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <vector>

#include "lowbit/qsync/comm_model.hpp"
#include "lowbit/qsync/cost_model.hpp"
#include "lowbit/qsync/simulator.hpp"
#include "qsync_fixtures.hpp"

using namespace lowbit::qsync;
using namespace lowbit::qsync::test;
using Catch::Matchers::Contains;

TEST_CASE("roofline: max of compute and memory time, backward twice for weighted ops") {
  const cost_model cm(round_device());
  op o = linear_op("l", {});
  o.flops = 2e9;  // 2 ms at fp32, 1 ms at fp16
  o.bytes = 4e9;  // 4 ms at fp32, 2 ms at fp16 (half the bytes)
  REQUIRE(cm.time(o, precision::fp32).forward_ms == Approx(4.0));
  REQUIRE(cm.time(o, precision::fp32).backward_ms == Approx(8.0));
  o.bytes = 1e6;
  REQUIRE(cm.time(o, precision::fp16).forward_ms == Approx(1.0));
  REQUIRE(cm.time(o, precision::fp16).backward_ms == Approx(2.0));  // two GEMMs
  o.frozen_numel = o.param_numel;  // no weight gradient: the input's alone
  REQUIRE(cm.time(o, precision::fp16).backward_ms == Approx(1.0));
  o.frozen_numel = 0;
  o.param_numel = 0;
  REQUIRE(cm.time(o, precision::fp16).backward_ms == Approx(1.0));  // one pass
  REQUIRE_THROWS_WITH(cm.roofline(o, precision::bf16), Contains("no bf16 mode"));
}

TEST_CASE("measured times win over the roofline, half-measured ops fill the other half") {
  measured_table t;
  t.set("l", precision::fp16, {0.25, 0.75});
  t.set("m", precision::fp16, {0.5, -1});
  const cost_model cm(round_device(), t);
  op l = linear_op("l", {});
  l.flops = 2e9;
  REQUIRE(cm.time(l, precision::fp16).forward_ms == 0.25);
  REQUIRE(cm.time(l, precision::fp16).backward_ms == 0.75);
  REQUIRE(cm.time(l, precision::fp32).forward_ms == Approx(2.0));  // not measured at fp32
  op m = l;
  m.name = "m";
  REQUIRE(cm.time(m, precision::fp16).forward_ms == 0.5);
  REQUIRE(cm.time(m, precision::fp16).backward_ms == Approx(2.0));
}

TEST_CASE("cast costs use QSync's T4 fits") {
  const cast_costs c = t4_cast_costs();
  REQUIRE(c.cost(precision::fp32, precision::fp16, 1e6) == Approx(2.878e-8 * 1e6 + 1.009e-3));
  REQUIRE(c.cost(precision::fp16, precision::fp32, 1e6) == Approx(2.878e-8 * 1e6 + 1.009e-3));
  REQUIRE(c.cost(precision::fp32, precision::int8, 1e6) == Approx(1.418e-7 * 1e6 + 1.222e-2));
  REQUIRE(c.cost(precision::int8, precision::fp32, 1e6) == Approx(2.727e-8 * 1e6 + 1.009e-3));
  REQUIRE(c.cost(precision::tf32, precision::fp32, 1e6) == 0.0);
  REQUIRE(c.cost(precision::fp16, precision::fp16, 1e6) == 0.0);
  // On a V100 the per-element term shrinks with bandwidth, the launch term stays.
  const device_profile v = v100();
  REQUIRE(v.casts.float_to_float.a_ms == Approx(2.878e-8 * 320 / 900));
  REQUIRE(v.casts.float_to_float.b_ms == Approx(1.009e-3));
}

TEST_CASE("casts are inserted only around the op whose precision changed") {
  device_profile d = round_device();
  d.casts = t4_cast_costs();
  const simulator sim(model_of(linear_chain(5)), {"c", {{d, 1, {}}}, builtin_link("pcie4")});
  auto p = sim.uniform(precision::fp32);
  auto count_casts = [&](const device_trace& t, std::set<std::size_t>* ops) {
    int n = 0;
    for (const auto& k : t.kernels)
      if (k.kind == kernel_kind::cast) {
        ++n;
        if (ops) ops->insert(k.op);
      }
    return n;
  };
  REQUIRE(count_casts(sim.trace(0, p.precisions[0]), nullptr) == 0);
  p.precisions[0][2] = precision::fp16;
  std::set<std::size_t> where;
  // Forward: input cast, weight cast (op2), output cast (op3's input). Backward: the
  // incoming gradient (op2), the weight gradient (op2), the outgoing gradient (op1).
  REQUIRE(count_casts(sim.trace(0, p.precisions[0]), &where) == 6);
  REQUIRE(where == std::set<std::size_t>{1, 2, 3});
  // Two neighbours at the same low precision need no cast between them.
  p.precisions[0][3] = precision::fp16;
  where.clear();
  REQUIRE(count_casts(sim.trace(0, p.precisions[0]), &where) == 8);
  REQUIRE(where == std::set<std::size_t>{1, 2, 3, 4});
}

TEST_CASE("a cast through code between the ops goes through the ambient precision") {
  device_profile d = round_device();
  d.casts = t4_cast_costs();
  using P = precision;
  const std::vector<P> plan = {P::fp32, P::fp32, P::fp16, P::fp16, P::fp32};  // ambient fp32
  auto count_casts = [&](const std::vector<op>& ops, cast_rule rule = cast_rule::ambient) {
    training_model m = model_of(ops);
    m.casts = rule;
    const simulator sim(m, {"c", {{d, 1, {}}}, builtin_link("pcie4")});
    int n = 0;
    for (const auto& k : sim.trace(0, plan).kernels) n += k.kind == kernel_kind::cast;
    return n;
  };
  auto ops = linear_chain(5);
  // op3 takes op2's output directly. Forward: op2's input and weights, op2's ambient
  // copy (read by nothing: dropped), op3's weights, op3's ambient copy (op4 reads it)
  // = 5; backward: op3's output gradient in, two weight gradients, op1's gradient out
  // = 4.
  REQUIRE(count_casts(ops) == 9);
  // op3 reads op2 through code between the ops (a residual add): that code ran at the
  // ambient fp32 on op2's ambient copy, so op3 casts its input back to fp16, and in
  // backward the gradient goes fp16 -> fp32 -> fp16 on that edge: three casts more.
  ops[3].via_code = {ops[2].name};
  REQUIRE(count_casts(ops) == 12);
  // Per edge (QSync's own rule), via_code changes nothing: op1 -> op2 and op3 -> op4,
  // forward and backward, plus two weight casts each way.
  REQUIRE(count_casts(ops, cast_rule::per_edge) == 8);
  // A layer norm autocast keeps at fp32 anyway: at fp32 among 16-bit ops it adds no casts
  // through the ambient (its neighbours' profiles hold them), four per edge.
  auto ln_ops = linear_chain(3);
  ln_ops[1].kind = op_kind::layer_norm;
  const std::vector<P> ln_plan = {P::fp16, P::fp32, P::fp16};
  auto ln_casts = [&](cast_rule rule) {
    training_model m = model_of(ln_ops);
    m.casts = rule;
    const simulator sim(m, {"c", {{d, 1, {}}}, builtin_link("pcie4")});
    int n = 0;
    for (const auto& k : sim.trace(0, ln_plan).kernels)
      n += k.kind == kernel_kind::cast && k.op != 0 && k.op != 2;
    return n;
  };
  REQUIRE(ln_casts(cast_rule::ambient) == 0);
  REQUIRE(ln_casts(cast_rule::per_edge) > 0);
  auto bad = linear_chain(3);
  bad[2].via_code = {bad[0].name};
  REQUIRE_THROWS_WITH(op_graph(bad), Catch::Contains("under via_code but not under inputs"));
}

TEST_CASE("memory: fp32 weights, gradients and state plus activations, 16-bit floor clamped") {
  op ln;
  ln.name = "ln";
  ln.kind = op_kind::layer_norm;
  ln.param_numel = 100;
  ln.saved_numel = 1000;
  op fc = linear_op("fc", {"ln"}, 400, 2000);
  const op_graph g({ln, fc});
  const auto m32 = memory_bytes(g, {precision::fp32, precision::fp32}, 8);
  REQUIRE(m32.weights == 2000);
  REQUIRE(m32.gradients == 2000);
  REQUIRE(m32.optimizer == 4000);
  REQUIRE(m32.activations == 12000);
  // int8 everywhere: the linear saves 1 byte per element, the layer norm never below 2.
  const auto m8 = memory_bytes(g, {precision::int8, precision::int8}, 8);
  REQUIRE(m8.activations == 1000 * 2 + 2000 * 1);
  // Plus autocast's copy of the linear's weights (1 byte each; the layer norm keeps
  // fp32 weights). The peak is at the linear's backward, the first: its gradient pair
  // (2 x 1000 outputs at 1 byte) and its weight gradient (1600 bytes) beside everything
  // saved; the layer norm's weight gradient (400 bytes) comes later, once the linear's
  // 2400 saved bytes are freed.
  REQUIRE(m8.weight_copies == 400 * 1);
  REQUIRE(m8.workspace == 2 * 1000);
  REQUIRE(m8.released == 400);
  REQUIRE(m8.total() == 2000 + 4000 + (1600 + 4000 + 400 + 2000));
  // At fp32 too the peak is there (gradients 1600, saved 12000, pair 8000), not at the
  // end of backward, where every gradient (2000) is held and nothing saved.
  REQUIRE(m32.total() == 2000 + 4000 + (1600 + 12000 + 8000));
  REQUIRE(clamp_precision(op_kind::softmax, precision::fp8) == precision::fp16);
  REQUIRE(clamp_precision(op_kind::conv, precision::int8) == precision::int8);
}

TEST_CASE("memory: frozen parameters hold weights only, unused ones too; no bucket share") {
  op emb = linear_op("emb", {}, 1000, 10);
  emb.frozen_numel = 1000;  // a frozen embedding
  op fc = linear_op("fc", {"emb"}, 400, 10);
  fc.frozen_numel = 100;  // part of it frozen (its bias trains)
  const op_graph g({emb, fc});
  REQUIRE(g.trainable_params() == 300);
  const auto m = memory_bytes(g, {precision::fp32, precision::fp32}, 8, 0.0, std::nullopt, 50);
  REQUIRE(m.weights == 4 * (1400 + 50));
  REQUIRE(m.gradients == 4 * 300);
  REQUIRE(m.optimizer == 8 * 300);
  const auto buckets = make_buckets(g, 25.0, 1.0);
  REQUIRE(buckets.size() == 1);
  REQUIRE(buckets[0].ops == std::vector<std::size_t>{1});  // the frozen op has no gradient
  REQUIRE(buckets[0].numel == 300);
  op bad = linear_op("bad", {}, 10, 10);
  bad.frozen_numel = 11;
  REQUIRE_THROWS_WITH(op_graph({bad}), Contains("frozen_numel must be in [0, param_numel]"));
}

TEST_CASE("memory: an edge cast the consumer saves, where the profile shared its input") {
  // relu keeps its output (1000 elements); the conv after it saved nothing of its own in
  // the uniform profiles (the storage was relu's), the bn after the conv saved its input.
  using P = precision;
  op relu;
  relu.name = "relu";
  relu.kind = op_kind::relu;
  relu.output_numel = 1000;
  relu.saved_bytes[index_of(P::fp32)] = 4000;
  relu.saved_bytes[index_of(P::fp16)] = 2000;
  op conv = linear_op("conv", {"relu"}, 10, 0, 1000);
  conv.kind = op_kind::conv;
  conv.saved_bytes[index_of(P::fp32)] = 0;
  conv.saved_bytes[index_of(P::fp16)] = 0;
  op bn = linear_op("bn", {"conv"}, 2, 0, 1000);
  bn.kind = op_kind::batch_norm;
  bn.saved_bytes[index_of(P::fp32)] = 4000;
  bn.saved_bytes[index_of(P::fp16)] = 2000;
  const op_graph g({relu, conv, bn});
  // Uniform: the profiles' own sharing, no copies.
  REQUIRE(memory_bytes(g, {P::fp32, P::fp32, P::fp32}, 0).cast_copies == 0);
  REQUIRE(memory_bytes(g, {P::fp16, P::fp16, P::fp16}, 0).cast_copies == 0);
  // relu at fp32, conv at fp16: the conv keeps the fp16 cast of relu's output (2000
  // bytes) beside relu's fp32 one; bn at fp32 casts the conv's output too, but its
  // profile holds its input already (4000 bytes at fp32): nothing added there.
  const auto m = memory_bytes(g, {P::fp32, P::fp16, P::fp32}, 0);
  REQUIRE(m.cast_copies == 2000);
  REQUIRE(m.total() == m.weights + m.gradients + m.activations + m.weight_copies + 2000 +
                           m.workspace - m.released);
  // tf32 and fp32 share storage: no cast, no copy.
  REQUIRE(memory_bytes(g, {P::fp32, P::tf32, P::fp32}, 0).cast_copies == 0);
  // Several producers seen through the code between modules are one input: the largest.
  op q = linear_op("q", {}, 10, 0, 1000), k = linear_op("k", {}, 10, 0, 1000);
  op o = linear_op("o", {"q", "k"}, 10, 0, 1000);
  o.saved_bytes[index_of(P::fp16)] = 0;
  const op_graph att({q, k, o});
  REQUIRE(memory_bytes(att, {P::fp32, P::fp32, P::fp16}, 0).cast_copies == 2000);
  REQUIRE(memory_bytes(att, {P::fp32, P::fp16, P::fp16}, 0).cast_copies == 2000);
  // Through code between the ops at an ambient precision (lowbit's plan applier): o's
  // input is that code's output, at the ambient width whatever q and k ran at; a copy
  // only where o runs at another width.
  o.via_code = {"q", "k"};
  const op_graph att_code({q, k, o});
  REQUIRE(memory_bytes(att_code, {P::fp32, P::fp16, P::fp16}, 0, 0, P::fp16).cast_copies == 0);
  REQUIRE(memory_bytes(att_code, {P::fp16, P::fp16, P::fp16}, 0, 0, P::fp32).cast_copies == 2000);
  REQUIRE(memory_bytes(att_code, {P::fp32, P::fp16, P::fp16}, 0).cast_copies == 2000);  // per edge
}

TEST_CASE("memory: autocast's per-consumer input casts are one shared copy under the applier") {
  // A layer norm feeding q, k and v (1000 outputs). In the uniform fp16 profile autocast
  // ran the norm at fp32 and cast its output once per linear: each saved its own fp16
  // copy (2000 bytes, all of its saved bytes).
  using P = precision;
  op ln;
  ln.name = "ln";
  ln.kind = op_kind::layer_norm;
  ln.output_numel = 1000;
  ln.saved_bytes[index_of(P::fp32)] = ln.saved_bytes[index_of(P::fp16)] = 4000;
  std::vector<op> ops = {ln};
  for (const char* n : {"q", "k", "v"}) {
    op l = linear_op(n, {"ln"}, 10, 0, 1000);
    l.saved_bytes[index_of(P::fp32)] = 0;  // the fp32 profile: the norm's output, saved by q
    l.saved_bytes[index_of(P::fp16)] = 2000;
    l.input_cast_bytes[index_of(P::fp16)] = 2000;
    ops.push_back(l);
  }
  ops[1].saved_bytes[index_of(P::fp32)] = 4000;
  const op_graph g(ops);
  const double base = 4000 + 3 * 2000;
  // Uniform fp16: the norm is at the ambient, its output stays fp32 and autocast casts it
  // per consumer, as profiled.
  REQUIRE(memory_bytes(g, {P::fp16, P::fp16, P::fp16, P::fp16}, 0, 0, P::fp16).activations == base);
  // The norm at fp32 off the ambient fp16: the applier casts its output once and q, k and
  // v share it: two copies fewer.
  const auto shared = memory_bytes(g, {P::fp32, P::fp16, P::fp16, P::fp16}, 0, 0, P::fp16);
  REQUIRE(shared.activations == base - 2 * 2000);
  REQUIRE(shared_input_casts(g, {P::fp32, P::fp16, P::fp16, P::fp16}, P::fp16) == 4000);
  // v at bf16 (off the ambient, fed the norm's own output, cast by itself): q and k share.
  REQUIRE(shared_input_casts(g, {P::fp32, P::fp16, P::fp16, P::bf16}, P::fp16) == 2000);
  // Without the applier's rule (per-edge casts, the built-in models) nothing changes.
  REQUIRE(memory_bytes(g, {P::fp32, P::fp16, P::fp16, P::fp16}, 0).activations == base);
  // Through code between the ops the consumer saves what that code made: no sharing.
  for (std::size_t i = 1; i < 4; ++i) ops[i].via_code = {"ln"};
  REQUIRE(shared_input_casts(op_graph(ops), {P::fp32, P::fp16, P::fp16, P::fp16}, P::fp16) == 0);
}

TEST_CASE("memory: what code between the ops saved is taken at the ambient precision") {
  // v's recording holds attention's core saved after it: 6000 bytes at fp32 (of 10000),
  // 3000 at fp16 (of 5000).
  using P = precision;
  op v = linear_op("v", {}, 10, 0, 1000);
  v.saved_bytes[index_of(P::fp32)] = 10000;
  v.saved_bytes[index_of(P::fp16)] = 5000;
  v.code_saved_bytes[index_of(P::fp32)] = 6000;
  v.code_saved_bytes[index_of(P::fp16)] = 3000;
  op o = linear_op("o", {"v"}, 10, 0, 1000);
  o.saved_bytes[index_of(P::fp32)] = o.saved_bytes[index_of(P::fp16)] = 0;
  o.via_code = {"v"};
  const op_graph g({v, o});
  // v at fp32 with the step at fp16: v's own 4000 bytes, attention's 3000 at fp16.
  REQUIRE(memory_bytes(g, {P::fp32, P::fp16}, 0, 0, P::fp16).activations == 4000 + 3000);
  // v at fp16 with the step at fp32: 2000 and 6000.
  REQUIRE(memory_bytes(g, {P::fp16, P::fp32}, 0, 0, P::fp32).activations == 2000 + 6000);
  // At the ambient, or without the applier's rule: as recorded.
  REQUIRE(memory_bytes(g, {P::fp16, P::fp16}, 0, 0, P::fp16).activations == 5000);
  REQUIRE(memory_bytes(g, {P::fp32, P::fp16}, 0).activations == 10000);
  // No code saved at fp16 (absent): the fp32 part is dropped, nothing added.
  v.code_saved_bytes[index_of(P::fp16)] = -1;
  REQUIRE(memory_bytes(op_graph({v, o}), {P::fp32, P::fp16}, 0, 0, P::fp16).activations == 4000);
}

namespace {
// a -> b -> c, 1000 outputs each, each saving 4000 bytes at fp32 and holding 10 parameters.
std::vector<op> saving_chain() {
  std::vector<op> ops = {linear_op("a", {}, 10, 0, 1000), linear_op("b", {"a"}, 10, 0, 1000),
                         linear_op("c", {"b"}, 10, 0, 1000)};
  for (op& o : ops) o.saved_bytes[index_of(precision::fp32)] = 4000;
  return ops;
}
}  // namespace

TEST_CASE("memory: an op's measured scratch counts where it runs, less what is freed by then") {
  // a -> b -> c, 1000 outputs each, each saving 4000 bytes at fp32 and holding 10
  // parameters (40 bytes of gradient). Backward runs c, b, a: when b runs, c's 4000
  // saved bytes are free, when a runs, b's and c's; the gradients come one op at a time.
  using P = precision;
  std::vector<op> ops = saving_chain();
  const std::vector<P> fp32(3, P::fp32);
  const auto held = [&](const std::vector<op>& o) {  // gradients + saved + in flight
    const memory_breakdown m = memory_bytes(op_graph(o), fp32, 0);
    return m.total() - m.weights - m.optimizer;
  };
  const double base = memory_bytes(op_graph(ops), fp32, 0).workspace;
  REQUIRE(base == 8000);  // c's gradient pair, nothing freed yet
  REQUIRE(held(ops) == 40 + 12000 + 8000);
  // b's 20000 bytes of scratch, with c's 4000 freed and c's and b's gradients held.
  ops[1].workspace_bytes[index_of(P::fp32)] = 20000;
  REQUIRE(memory_bytes(op_graph(ops), fp32, 0).workspace == 28000);
  REQUIRE(held(ops) == 80 + 8000 + 28000);
  // The same scratch on a: b's and c's freed, every gradient held.
  ops[1].workspace_bytes[index_of(P::fp32)] = -1;
  ops[0].workspace_bytes[index_of(P::fp32)] = 20000;
  REQUIRE(memory_bytes(op_graph(ops), fp32, 0).workspace == 28000);
  REQUIRE(held(ops) == 120 + 4000 + 28000);
  // Scratch measured at fp32 only: a plan at fp16 takes none, and the library workspace
  // (MiB) comes on top.
  REQUIRE(memory_bytes(op_graph(ops), std::vector<P>(3, P::fp16), 0, 1).workspace ==
          1024.0 * 1024.0 + 2 * 1000 * 2);
  // Scratch no larger than what is freed by then adds nothing.
  ops[0].workspace_bytes[index_of(P::fp32)] = 1000;
  REQUIRE(memory_bytes(op_graph(ops), fp32, 0).workspace == base);
  // Weights outweighing what is saved (batch 1): the peak moves to the last op of
  // backward, every gradient held beside a's saved bytes and pair; b's and c's are freed.
  for (op& o : ops) o.param_numel = 10000, o.workspace_bytes[index_of(P::fp32)] = -1;
  const memory_breakdown big = memory_bytes(op_graph(ops), fp32, 0);
  REQUIRE(big.total() == big.weights + 3 * 40000 + 4000 + 8000);
  REQUIRE(big.released == 8000);
  REQUIRE(big.workspace == 8000);
}

TEST_CASE("memory: the code after an op holds its backward transient before the op's") {
  // a -> b -> c as above (4000 saved bytes each, 40 bytes of gradient, 1000 outputs): the
  // loss after c (a language model's head) allocates 30000 transient bytes in its
  // backward, before c's backward and c's weight gradient; measured at fp32 and fp16.
  using P = precision;
  std::vector<op> ops = saving_chain();
  const std::vector<P> fp32(3, P::fp32);
  const double before = memory_bytes(op_graph(ops), fp32, 0).total();
  ops[2].code_workspace_bytes[index_of(P::fp32)] = 30000;
  const memory_breakdown m = memory_bytes(op_graph(ops), fp32, 0);
  REQUIRE(m.workspace == 30000);                       // in place of c's gradient pair (8000)
  REQUIRE(m.total() == m.weights + 3 * 4000 + 30000);  // no gradient yet
  REQUIRE(m.total() - before == 30000 - 8000 - 40);
  // Smaller than c's own pair and gradient: nothing changes.
  ops[2].code_workspace_bytes[index_of(P::fp32)] = 8000;
  REQUIRE(memory_bytes(op_graph(ops), fp32, 0).total() == before);
  // Under the applier the code runs at the ambient: c at fp32 in an fp16 step takes the
  // code's fp16 transient.
  ops[2].code_workspace_bytes[index_of(P::fp32)] = 30000;
  ops[2].code_workspace_bytes[index_of(P::fp16)] = 50000;
  REQUIRE(memory_bytes(op_graph(ops), fp32, 0, 0, P::fp16).workspace == 50000);
  REQUIRE(memory_bytes(op_graph(ops), fp32, 0, 0, P::fp32).workspace == 30000);
}

TEST_CASE("memory: weights several calls share get one gradient, early, and one copy") {
  // emb (an embedding of 10000 parameters) -> mid (a linear, 10) -> head, a linear tied to
  // emb (weights_from): 10 outputs each, nothing saved. Backward runs head, mid, emb:
  // head's gradient of the shared weights (40000 bytes) is allocated first and held; at
  // emb's backward, emb's contribution (40000 more) is in flight while autograd adds it
  // in place.
  using P = precision;
  op emb = linear_op("emb", {}, 10000, 0, 10);
  emb.kind = op_kind::embedding;
  op mid = linear_op("mid", {"emb"}, 10, 0, 10);
  op head = linear_op("head", {"emb", "mid"}, 0, 0, 10);
  head.weights_from = "emb";
  const op_graph g({emb, mid, head});
  const memory_breakdown m = memory_bytes(g, std::vector<P>(3, P::fp32), 8);
  REQUIRE(m.gradients == 4 * 10010);
  // gradients 40040, emb's contribution 40000 and its gradient pair 80, nothing saved
  REQUIRE(m.total() == m.weights + m.optimizer + 40040 + 40000 + 80);
  REQUIRE(m.workspace == 40000 + 80);
  // Untied (head's own weights in place of emb's): one gradient each, no contribution in
  // flight, the peak at the end of backward.
  op own = head;
  own.weights_from.clear();
  own.param_numel = 10000;
  const memory_breakdown untied =
      memory_bytes(op_graph({emb, mid, own}), std::vector<P>(3, P::fp32), 8);
  REQUIRE(untied.total() == untied.weights + untied.optimizer + 4 * 20010 + 80);
  // At fp16 autocast copies the shared weights once, for head (embeddings are not cast).
  const memory_breakdown m16 = memory_bytes(g, std::vector<P>(3, P::fp16), 8);
  REQUIRE(m16.weight_copies == 10000 * 2 + 10 * 2);
  // A linear called twice (its second call runs with the first's weights): one copy.
  op f = linear_op("f", {}, 100, 0, 10);
  op f2 = linear_op("f#2", {"f"}, 0, 0, 10);
  f2.weights_from = "f";
  REQUIRE(memory_bytes(op_graph({f, f2}), std::vector<P>(2, P::fp16), 8).weight_copies == 100 * 2);
}

TEST_CASE("allowed precisions follow the device menu and the 16-bit floor") {
  op ln;
  ln.name = "ln";
  ln.kind = op_kind::layer_norm;
  const op fc = linear_op("fc", {});
  using P = precision;
  REQUIRE(allowed_precisions(fc, t4()) == std::vector<P>{P::int8, P::fp16, P::fp32});
  REQUIRE(allowed_precisions(ln, t4()) == std::vector<P>{P::fp16, P::fp32});
  REQUIRE(allowed_precisions(fc, v100()) == std::vector<P>{P::fp16, P::fp32});
  REQUIRE(allowed_precisions(fc, a100()) ==
          std::vector<P>{P::int8, P::fp16, P::bf16, P::tf32, P::fp32});
  op bf = fc;
  bf.allowed = {P::bf16};
  REQUIRE_THROWS_WITH(allowed_precisions(bf, t4()), Contains("op 'fc'") && Contains("device 'T4'"));
  REQUIRE(nearest_allowed({P::fp16, P::fp32}, P::int8) == P::fp16);
  REQUIRE(nearest_allowed({P::int8, P::fp16}, P::fp32) == P::fp16);
}

TEST_CASE("wire bytes mirror the codec frame: 16-byte aligned scales, then codes") {
  REQUIRE(wire_bytes(32, 256) == 1024);
  REQUIRE(wire_bytes(16, 256) == 512);
  REQUIRE(wire_bytes(4, 256) == 16 + 2 * 64);  // 2 scales padded to 16, 2 x 64 B codes
  REQUIRE(wire_bytes(3, 100) == 16 + 48);      // a partial block is a whole block
  REQUIRE(wire_bytes(1, 128 * 5) == 32 + 80);  // 20 B of scales pad to 32
  REQUIRE(wire_bytes(4, 0) == 0);
  REQUIRE_THROWS_AS(wire_bytes(17, 10), lowbit::invalid_argument);
  // All-reduce: P-1 shard frames out, then the reduced shard to P-1 peers.
  REQUIRE(all_reduce_bytes_per_rank(4, 1024, 4) == 2 * 3 * wire_bytes(4, 256));
  REQUIRE(all_reduce_bytes_per_rank(4, 1024, 1) == 0);
  const link_profile l{"l", 1.0, 0.01};  // 1 GB/s = 1e6 B/ms
  const device_profile d = round_device();
  REQUIRE(all_reduce_ms(32, 1e6, 2, l, d) == Approx(2 * 0.01 + 4e6 / 1e6));
  REQUIRE(all_reduce_ms(4, 1e6, 2, l, d) > 2 * 0.01 + all_reduce_bytes_per_rank(4, 1e6, 2) / 1e6);
  REQUIRE(all_reduce_ms(4, 1e6, 2, l, d) < all_reduce_ms(32, 1e6, 2, l, d));
}

TEST_CASE("built-in devices and links carry datasheet numbers, unknown names are errors") {
  REQUIRE(t4().peak_tflops[index_of(precision::int8)] == 130);
  REQUIRE(h200().memory_gib == 141);
  REQUIRE(h200().memory_bandwidth_gbs == 4800);
  REQUIRE(a100().supports(precision::tf32));
  REQUIRE_FALSE(v100().supports(precision::bf16));
  REQUIRE(builtin_link("ethernet-25g").bandwidth_gbs == Approx(3.125));
  REQUIRE_THROWS_WITH(builtin_device("K80"), Contains("unknown device 'K80'"));
  REQUIRE_THROWS_WITH(builtin_link("carrier-pigeon"), Contains("unknown link"));
}

TEST_CASE("simulator: hybrid groups share bucket times, the iteration is the slowest group's") {
  device_profile fast = round_device("fast");
  device_profile slow = round_device("slow");
  for (double& p : slow.peak_tflops) p /= 4;
  auto ops = linear_chain(4);
  for (auto& o : ops) o.param_numel = 262144.0 * 0.6;  // two buckets of two ops
  const simulator sim(model_of(ops, 1.0, 1.0),
                      {"hybrid", {{fast, 2, {}}, {slow, 1, {}}}, {"l", 1.0, 0.001}});
  REQUIRE(sim.buckets().size() == 2);
  const evaluation e = sim.evaluate(sim.uniform(precision::fp32, 8));
  // The slow group finishes its backward last, so it sets every bucket's start.
  const auto slow_timing = e.groups[1].timing;
  REQUIRE(e.times.bucket_start[0] == Approx(slow_timing.bucket_ready_ms[0]));
  REQUIRE(e.times.bucket_start[1] ==
          Approx(std::max(slow_timing.bucket_ready_ms[1], e.times.bucket_end[0])));
  REQUIRE(e.times.iteration_ms == Approx(std::max(e.times.device_ms[0], e.times.device_ms[1])));
  // The fast group waits for the shared all-reduces: both end after the last bucket,
  // plus equal optimizer tails (same bandwidth), so at the same time.
  REQUIRE(e.times.device_ms[0] >= e.times.bucket_end[1]);
  REQUIRE(e.times.device_ms[0] == Approx(e.times.device_ms[1]));
  REQUIRE(e.groups[0].timing.compute_end < e.groups[1].timing.compute_end);
}

TEST_CASE(
    "hierarchical_all_reduce_ms: one node is the intra stages, one rank per node the flat "
    "all-reduce, and fewer cross-node bits are faster") {
  using namespace lowbit::qsync;
  const device_profile dev = h200();
  const link_profile nv = builtin_link("nvlink4"), ib = builtin_link("ib-ndr");
  const double n = 1 << 26;
  CHECK(hierarchical_all_reduce_ms(4, n, 4, 1, nv, ib, dev) == all_reduce_ms(4, n, 4, ib, dev));
  const double intra = hierarchical_all_reduce_ms(4, n, 1, 8, nv, ib, dev);
  CHECK(intra ==
        Approx(2 * (7 * nv.latency_ms + 7 * wire_bytes(32, n / 8) / (nv.bandwidth_gbs * 1e6))));
  CHECK(hierarchical_all_reduce_ms(4, n, 8, 8, nv, ib, dev) <
        hierarchical_all_reduce_ms(8, n, 8, 8, nv, ib, dev));
  CHECK(hierarchical_all_reduce_ms(8, n, 8, 8, nv, ib, dev) <
        hierarchical_all_reduce_ms(32, n, 8, 8, nv, ib, dev));
}
