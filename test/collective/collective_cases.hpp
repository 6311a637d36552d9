// The collective test cases, written once and run on both backends (MatX style): the
// including file defines `lowbit::test::harness` (communicator, backend tag, and how
// to run a call on host vectors), then includes this file, which defines the
// TEST_CASEs. Every rank runs every case in the same order; checks that could differ
// between ranks never skip a collective call (a skipped call would hang the others).
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "collective_test_util.hpp"
#include "lowbit/collective/all_gather.hpp"
#include "lowbit/collective/all_reduce.hpp"
#include "lowbit/collective/reduce_scatter.hpp"

namespace lowbit::test {

using C4n = codec<quant::absmax<4, 128>, round::nearest>;
using C2s = codec<quant::absmax<2, 64>, round::stochastic>;
using C1n = codec<quant::absmax<1, 128>, round::nearest>;
using C2n = codec<quant::absmax<2, 128>, round::nearest>;
using C4s = codec<quant::absmax<4, 128>, round::stochastic>;
using C8n = codec<quant::absmax<8, 256>, round::nearest>;
template <int Bits>
using absmax_nearest = codec<quant::absmax<Bits, 128>, round::nearest>;

using B = typename harness::backend;
template <class T, class C, class F = feedback::none, class S = schedule::flat>
using ar = lowbit::all_reduce<T, C, F, S, B>;
template <class T, class C, class F = feedback::none, class S = schedule::flat>
using rs = lowbit::reduce_scatter<T, C, F, S, B>;
template <class T, class C, class S = schedule::flat>
using ag = lowbit::all_gather<T, C, S, B>;

inline std::vector<std::size_t> test_counts() {
  const std::size_t P = static_cast<std::size_t>(world_size());
  return {0, 1, P - 1 > 0 ? P - 1 : 2, 200, 1000, 4099, 100003};
}

/// Every rank's input (as T), and the fp64 exact sum (times scale).
template <class T>
struct inputs {
  std::vector<std::vector<T>> xs;
  std::vector<std::vector<double>> xd;
  std::vector<double> exact;
  inputs(input_kind kind, std::size_t count, std::uint64_t salt, double scale = 1.0) {
    const int P = world_size();
    exact.assign(count, 0.0);
    for (int p = 0; p < P; ++p) {
      xs.push_back(convert<T>(make_input(kind, count, p, salt)));
      xd.push_back(to_double(xs.back()));
      for (std::size_t i = 0; i < count; ++i) exact[i] += xd.back()[i];
    }
    for (auto& v : exact) v *= scale;
  }
  const std::vector<T>& mine() const { return xs[world_rank()]; }
};

/// Runs one all_reduce and checks it against fp64, the simulation and the other ranks.
template <class T, class C, class S>
void check_all_reduce(std::size_t count, reduce_op op, input_kind kind, std::uint64_t salt,
                      all_reduce_algorithm algo = all_reduce_algorithm::automatic) {
  INFO("count " << count << ", " << C::bits << " bits, " << S::name << ", op "
                << (op == reduce_op::avg ? "avg" : "sum") << ", " << numeric_traits<T>::name << ", "
                << to_string(algo));
  const int P = world_size();
  const double scale = op == reduce_op::avg ? 1.0 / P : 1.0;
  const inputs<T> in(kind, count, salt, scale);
  collective_options o;
  o.op = op;
  o.seed = shared_seed() + salt;
  o.algorithm = algo;
  ar<T, C, feedback::none, S> reduce(harness::comm(), 100003, o);
  const auto resolved = reduce.algorithm();
  if (algo == all_reduce_algorithm::automatic)
    CHECK(resolved == (P == 2 ? all_reduce_algorithm::one_shot : all_reduce_algorithm::two_phase));
  else
    CHECK(resolved == algo);
  const auto step = reduce.step();
  std::vector<T> out(count);
  harness::call(reduce, in.mine(), out, count);
  CHECK(reduce.step() == step + (count ? 1 : 0));
  if (count == 0) return;
  const bool two_stages = resolved == all_reduce_algorithm::two_phase;
  CHECK(worst_ratio(out, in.exact, error_bound<C>(in.xd, two_stages, scale)) <= 1.0);
  CHECK(same_on_all_ranks(out.data(), out.size() * sizeof(T)));
  const auto sim = simulate_all_reduce<C>(in.xs, count, o.seed, step, op, resolved);
  CHECK(std::memcmp(sim.data(), out.data(), count * sizeof(T)) == 0);
}

TEST_CASE(
    "all_reduce: within the codec's bound of fp64, equal to the host simulation, identical on all "
    "ranks") {
  std::uint64_t salt = 1;
  for (const auto algo : {all_reduce_algorithm::automatic, all_reduce_algorithm::two_phase,
                          all_reduce_algorithm::one_shot}) {
    for (std::size_t count : test_counts()) {
      check_all_reduce<float, C4n, schedule::flat>(count, reduce_op::sum, input_kind::normal,
                                                   salt++, algo);
      check_all_reduce<float, C2s, schedule::flat>(count, reduce_op::avg, input_kind::normal,
                                                   salt++, algo);
      check_all_reduce<float, C4n, schedule::pipelined<3, 1>>(count, reduce_op::avg,
                                                              input_kind::normal, salt++, algo);
      check_all_reduce<float, C2s, schedule::ramped<6, 1>>(count, reduce_op::sum,
                                                           input_kind::normal, salt++, algo);
    }
  }
}

TEST_CASE("all_reduce: half and bfloat16 elements (fp32 accumulation)") {
  for (std::size_t count : {std::size_t(1000), std::size_t(4099)}) {
    check_all_reduce<__nv_bfloat16, C4n, schedule::flat>(count, reduce_op::sum, input_kind::normal,
                                                         101);
    check_all_reduce<__half, C2s, schedule::pipelined<2, 1>>(count, reduce_op::avg,
                                                             input_kind::normal, 102);
  }
}

TEST_CASE(
    "all_reduce: pipelined and ramped chunks give the same bytes as flat, feedback state "
    "included") {
  const std::size_t count = 50001;
  const inputs<float> in(input_kind::normal, count, 7);
  collective_options o;
  o.seed = 99;
  using F = feedback::residual<float, true>;
  ar<float, C2s, F> flat(harness::comm(), count, o);
  ar<float, C2s, F, schedule::pipelined<4, 1>> piped(harness::comm(), count, o);
  ar<float, C2s, F, schedule::ramped<8, 1>> ramped(harness::comm(), count, o);
  int differ = 0;
  for (int step = 0; step < 3; ++step) {
    std::vector<float> a(count), b(count), c(count);
    harness::call(flat, in.mine(), a, count);
    harness::call(piped, in.mine(), b, count);
    harness::call(ramped, in.mine(), c, count);
    differ += std::memcmp(a.data(), b.data(), count * sizeof(float)) != 0;
    differ += std::memcmp(a.data(), c.data(), count * sizeof(float)) != 0;
  }
  CHECK(differ == 0);
}

TEST_CASE("all_reduce: in place") {
  const std::size_t count = 4099;
  const inputs<float> in(input_kind::normal, count, 8);
  ar<float, C4n, feedback::none, schedule::pipelined<2, 1>> reduce(harness::comm(), count);
  std::vector<float> outp(count), buf = in.mine();
  harness::call(reduce, in.mine(), outp, count);
  reduce.set_step(0);
  harness::call_in_place(reduce, buf, 0, 0, count);
  CHECK(std::memcmp(outp.data(), buf.data(), count * sizeof(float)) == 0);
}

// bitscom's 2-GPU cases: max |lowbit - host simulation| < 1e-4 (here: bitwise equal),
// and within the codec's bound of the exact sum.
TEST_CASE("all_reduce: bitscom's acceptance cases") {
  check_all_reduce<float, absmax_nearest<4>, schedule::flat>(1031, reduce_op::sum,
                                                             input_kind::linspace, 201);
  check_all_reduce<float, absmax_nearest<2>, schedule::flat>(4099, reduce_op::sum,
                                                             input_kind::normal, 202);
  check_all_reduce<float, C1n, schedule::flat>(2048, reduce_op::sum, input_kind::alternating, 203);
  check_all_reduce<float, absmax_nearest<4>, schedule::flat>(512, reduce_op::sum,
                                                             input_kind::smooth, 204);
  check_all_reduce<float, absmax_nearest<2>, schedule::flat>(777, reduce_op::sum,
                                                             input_kind::spikes, 205);

  SECTION("1 bit keeps the sign (bitscom loses it)") {
    const std::size_t count = 2048;
    const inputs<float> in(input_kind::alternating, count, 206);
    ar<float, C1n> reduce(harness::comm(), count);
    std::vector<float> out(count);
    harness::call(reduce, in.mine(), out, count);
    int wrong = 0;
    for (std::size_t i = 0; i < count; ++i) wrong += (out[i] > 0) != (in.exact[i] > 0);
    CHECK(wrong == 0);
  }
}

TEST_CASE("all_reduce: ones * (rank + 1) at 4 bits sums to count * sum(1..P) within 1e-3") {
  const std::size_t count = 1024;
  const int P = world_size();
  const inputs<float> in(input_kind::ones, count, 0);
  auto run = [&](auto tag) {
    using C = decltype(tag);
    ar<float, C> reduce(harness::comm(), count);
    std::vector<float> out(count);
    harness::call(reduce, in.mine(), out, count);
    double total = 0;
    for (float v : out) total += v;
    CHECK(std::abs(total - 1024.0 * P * (P + 1) / 2) <= 1e-3);
  };
  run(codec<quant::absmax<4, 128>, round::nearest>{});
  run(codec<quant::absmax<4, 128, quant::grid::zero>, round::nearest>{});
}

TEST_CASE(
    "all_reduce: stochastic runs differ, stay near the deterministic result, agree across ranks") {
  const std::size_t count = 4099;
  const inputs<float> in(input_kind::normal, count, 301);
  std::vector<float> det(count), s1(count), s2(count);
  ar<float, C4n> nearest(harness::comm(), count);
  harness::call(nearest, in.mine(), det, count);
  collective_options o1, o2;
  o1.seed = 1;
  o2.seed = 2;
  ar<float, C4s> a(harness::comm(), count, o1), b(harness::comm(), count, o2);
  harness::call(a, in.mine(), s1, count);
  harness::call(b, in.mine(), s2, count);
  CHECK(std::memcmp(s1.data(), s2.data(), count * sizeof(float)) != 0);
  const auto bound_s = error_bound<C4s>(in.xd, true, 1.0);
  const auto bound_n = error_bound<C4n>(in.xd, true, 1.0);
  double worst = 0;
  bool finite = true;
  for (std::size_t i = 0; i < count; ++i) {
    finite = finite && std::isfinite(s1[i]) && std::isfinite(s2[i]);
    worst = std::max(worst, std::abs(double(s1[i]) - det[i]) / (bound_s[i] + bound_n[i]));
    worst = std::max(worst, std::abs(double(s2[i]) - det[i]) / (bound_s[i] + bound_n[i]));
  }
  CHECK(finite);
  CHECK(worst <= 1.0);
  CHECK(same_on_all_ranks(s1.data(), count * sizeof(float)));
  CHECK(same_on_all_ranks(s2.data(), count * sizeof(float)));
}

TEST_CASE("all_reduce: reproducible with a seed, step after step") {
  const std::size_t count = 3001;
  const inputs<float> in(input_kind::normal, count, 302);
  collective_options o;
  o.seed = shared_seed();
  ar<float, C2s, feedback::residual<>> a(harness::comm(), count, o), b(harness::comm(), count, o);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> x(count), y(count);
    harness::call(a, in.mine(), x, count);
    harness::call(b, in.mine(), y, count);
    CHECK(std::memcmp(x.data(), y.data(), count * sizeof(float)) == 0);
  }
}

TEST_CASE(
    "all_reduce: a block holding inf or nan decodes to nan on every rank, other blocks stay "
    "finite") {
  const std::size_t count = 1000;
  const int P = world_size();
  inputs<float> in(input_kind::normal, count, 303);
  std::vector<float> x = in.mine();
  if (world_rank() == P - 1) {
    x[5] = INFINITY;
    x[300] = NAN;
  }
  ar<float, C4n> reduce(harness::comm(), count);
  std::vector<float> out(count);
  harness::call(reduce, x, out, count);
  int bad = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const bool poisoned = i / 128 == 0 || i / 128 == 2;
    bad += poisoned ? !std::isnan(out[i]) : !std::isfinite(out[i]);
  }
  CHECK(bad == 0);
  CHECK(same_on_all_ranks(out.data(), count * sizeof(float)));
}

// With a constant input, classic EF's error telescopes: the running mean of the
// outputs converges to the exact mean (as 1/T).
template <class F>
void check_classic_ef(int steps, double factor) {
  const std::size_t count = 2500;
  const inputs<float> in(input_kind::constant_normal, count, 401, 1.0 / world_size());
  collective_options o;
  o.op = reduce_op::avg;
  ar<float, C2n, F, schedule::pipelined<2, 1>> reduce(harness::comm(), count, o);
  std::vector<double> mean(count, 0.0);
  std::vector<float> out(count);
  double first = 0;
  for (int t = 1; t <= steps; ++t) {
    harness::call(reduce, in.mine(), out, count);
    for (std::size_t i = 0; i < count; ++i) mean[i] += out[i];
    if (t == 1)
      for (std::size_t i = 0; i < count; ++i)
        first = std::max(first, std::abs(out[i] - in.exact[i]));
  }
  double last = 0;
  for (std::size_t i = 0; i < count; ++i)
    last = std::max(last, std::abs(mean[i] / steps - in.exact[i]));
  INFO(F::name << ": error of one step " << first << ", of the mean of " << steps << " steps "
               << last);
  CHECK(first > 0.01);
  CHECK(last <= first * factor);
  CHECK(same_on_all_ranks(out.data(), count * sizeof(float)));
}

TEST_CASE("classic error feedback: the running mean of the outputs converges to the exact mean") {
  check_classic_ef<feedback::residual<float, true>>(200, 0.02);
  check_classic_ef<feedback::residual<__nv_bfloat16, true>>(200, 0.02);
}

// EF21: g_i tracks x_i and, with the stage-2 residual, g tracks their mean exactly.
template <class F>
void check_ef21(int steps) {
  const std::size_t count = 2500;
  const inputs<float> in(input_kind::constant_normal, count, 402, 1.0 / world_size());
  collective_options o;
  o.op = reduce_op::avg;
  ar<float, C2n, F> reduce(harness::comm(), count, o);
  std::vector<float> out(count);
  double first = 0, last = 0;
  for (int t = 1; t <= steps; ++t) {
    harness::call(reduce, in.mine(), out, count);
    double err = 0;
    for (std::size_t i = 0; i < count; ++i) err = std::max(err, std::abs(out[i] - in.exact[i]));
    if (t == 1) first = err;
    last = err;
  }
  INFO(F::name << ": error after one step " << first << ", after " << steps << " steps " << last);
  CHECK(first > 0.01);
  CHECK(last <= 1e-5);
  CHECK(same_on_all_ranks(out.data(), count * sizeof(float)));
}

TEST_CASE("EF21: the output converges to the exact mean") {
  check_ef21<feedback::ef21<float>>(60);  // bf16 g_i is refused at compile time: it drifts
}

TEST_CASE(
    "EF21 without the stage-2 residual keeps the re-quantization error (why it is the default)") {
  const std::size_t count = 2500;
  const inputs<float> in(input_kind::constant_normal, count, 403, 1.0 / world_size());
  collective_options o;
  o.op = reduce_op::avg;
  o.algorithm = all_reduce_algorithm::two_phase;  // one_shot has no re-quantization
  ar<float, C2n, feedback::ef21<float, false>> reduce(harness::comm(), count, o);
  std::vector<float> out(count);
  for (int t = 0; t < 30; ++t) harness::call(reduce, in.mine(), out, count);
  double err = 0;
  for (std::size_t i = 0; i < count; ++i) err = std::max(err, std::abs(out[i] - in.exact[i]));
  CHECK(err > 0.01);
}

// Zero state is no feedback: every policy's first step gives the bytes of
// feedback::none; the second differs; reset_feedback() (and the step) brings it back.
template <class F, class Coll>
void check_first_step(std::size_t count, const std::vector<float>& x,
                      const std::vector<float>& none, const collective_options& o = {}) {
  INFO(F::name);
  Coll c(harness::comm(), count, o);
  std::vector<float> a(count), b(count);
  harness::call(c, x, a, count);
  CHECK(a == none);
  harness::call(c, x, b, count);
  CHECK(b != none);
  c.reset_feedback();
  c.set_step(0);
  harness::call(c, x, b, count);
  CHECK(b == none);
}

TEST_CASE("feedback state starts at zero, evolves, and resets") {
  const std::size_t count = 3000;
  const inputs<float> in(input_kind::normal, count, 450);
  std::vector<float> none(count), none2(count);
  ar<float, C2s> plain(harness::comm(), count);
  harness::call(plain, in.mine(), none, count);
  check_first_step<feedback::residual<>, ar<float, C2s, feedback::residual<>>>(count, in.mine(),
                                                                               none);
  check_first_step<feedback::ef21<>, ar<float, C2s, feedback::ef21<>>>(count, in.mine(), none);
  // The second stage acts on two_phase's re-encoding only.
  collective_options two;
  two.algorithm = all_reduce_algorithm::two_phase;
  ar<float, C2s> plain2(harness::comm(), count, two);
  harness::call(plain2, in.mine(), none2, count);
  check_first_step<feedback::stage2_only<>, ar<float, C2s, feedback::stage2_only<>>>(
      count, in.mine(), none2, two);
  check_first_step<
      feedback::residual<__nv_bfloat16, true>,
      ar<float, C2s, feedback::residual<__nv_bfloat16, true>, schedule::pipelined<3, 1>>>(
      count, in.mine(), none2, two);
}

TEST_CASE("reduce_scatter: my shard is the exact sum of the decoded frames (one quantization)") {
  const int P = world_size();
  std::uint64_t salt = 500;
  for (std::size_t count : test_counts()) {
    for (reduce_op op : {reduce_op::sum, reduce_op::avg}) {
      INFO("count " << count);
      const double scale = op == reduce_op::avg ? 1.0 / P : 1.0;
      const inputs<float> in(input_kind::normal, count, ++salt, scale);
      collective_options o;
      o.op = op;
      rs<float, C4n, feedback::none, schedule::ramped<5, 1>> scatter(harness::comm(), 100003, o);
      const auto s = scatter.shard(count);
      CHECK(s.begin == schedule::shard(count, 128, P, world_rank()).begin);
      std::vector<float> out(s.count);
      harness::call(scatter, in.mine(), out, count);
      const auto bound = error_bound<C4n>(in.xd, false, scale);
      std::vector<double> ex(in.exact.begin() + s.begin, in.exact.begin() + s.end());
      std::vector<double> bd(bound.begin() + s.begin, bound.begin() + s.end());
      CHECK(worst_ratio(out, ex, bd) <= 1.0);
      // in place: out = in + shard.begin
      std::vector<float> buf = in.mine();
      scatter.set_step(0);
      harness::call_in_place(scatter, buf, 0, s.begin, count);
      CHECK(std::equal(out.begin(), out.end(), buf.begin() + s.begin));
    }
  }
}

TEST_CASE("reduce_scatter with EF21: my shard converges to the exact mean") {
  const std::size_t count = 3000;
  const inputs<float> in(input_kind::constant_normal, count, 601, 1.0 / world_size());
  collective_options o;
  o.op = reduce_op::avg;
  rs<float, C2n, feedback::ef21<float, false>> scatter(harness::comm(), count, o);
  const auto s = scatter.shard(count);
  std::vector<float> out(s.count);
  for (int t = 0; t < 60; ++t) harness::call(scatter, in.mine(), out, count);
  double err = 0;
  for (std::size_t i = 0; i < s.count; ++i)
    err = std::max(err, std::abs(out[i] - in.exact[s.begin + i]));
  CHECK(err <= 1e-5);
}

TEST_CASE("all_gather: every rank decodes every shard, identically, within one quantization") {
  const int P = world_size();
  for (std::size_t count : test_counts()) {
    INFO("count " << count);
    // A tensor every rank knows; each passes its own shard.
    const auto w = convert<float>(make_input(input_kind::normal, count, 0, 700 + count));
    ag<float, C4s, schedule::ramped<4, 1>> gather(harness::comm(), 100003);
    const auto s = gather.shard(count);
    CHECK(s.begin == schedule::shard(count, 128, P, world_rank()).begin);
    std::vector<float> mine(w.begin() + s.begin, w.begin() + s.end()), out(count);
    harness::call(gather, mine, out, count);
    const auto bound = error_bound<C4s>({to_double(w)}, false, 1.0);
    CHECK(worst_ratio(out, to_double(w), bound) <= 1.0);
    CHECK(same_on_all_ranks(out.data(), count * sizeof(float)));
    std::vector<float> buf(count, 0.0f);
    std::copy(mine.begin(), mine.end(), buf.begin() + s.begin);
    gather.set_step(0);
    harness::call_in_place(gather, buf, s.begin, 0, count);
    CHECK(buf == out);
  }
}

TEST_CASE("dynamic_all_reduce: a run-time width gives the same bytes as the static width") {
  const std::size_t count = 5000;
  const inputs<float> in(input_kind::normal, count, 801);
  lowbit::dynamic_all_reduce<float, absmax_nearest, bit_widths<1, 2, 4, 8>, feedback::none,
                             schedule::flat, B>
      dyn(harness::comm(), count);
  STATIC_REQUIRE(decltype(dyn)::supports(4));
  STATIC_REQUIRE_FALSE(decltype(dyn)::supports(3));
  auto same_as = [&](int bits, auto tag) {
    using C = decltype(tag);
    ar<float, C> fixed(harness::comm(), count);
    fixed.set_step(dyn.step());
    std::vector<float> x(count), y(count);
    harness::call_dynamic(dyn, in.mine(), x, count, bits);
    harness::call(fixed, in.mine(), y, count);
    CHECK(std::memcmp(x.data(), y.data(), count * sizeof(float)) == 0);
  };
  same_as(4, absmax_nearest<4>{});
  same_as(1, absmax_nearest<1>{});
  same_as(8, absmax_nearest<8>{});
  same_as(2, absmax_nearest<2>{});
  std::vector<float> x(count);
  CHECK_THROWS_AS(harness::call_dynamic(dyn, in.mine(), x, count, 3), lowbit::invalid_argument);
}

TEST_CASE("dynamic_all_reduce: the reduced shard is where the second-stage residual lies") {
  const int P = world_size();
  const std::size_t count = 5000;
  collective_options two;
  two.algorithm = all_reduce_algorithm::two_phase;
  lowbit::dynamic_all_reduce<float, absmax_nearest, bit_widths<2, 4>, feedback::stage2_only<>,
                             schedule::flat, B>
      dyn(harness::comm(), count, two);
  const auto& st = dyn.feedback_state();
  for (int bits : {2, 4}) {
    const auto r = dyn.reduced_shard(count, bits);
    CHECK(r.begin == schedule::shard(count, 128, P, world_rank()).begin);
    CHECK(r.count == schedule::shard(count, 128, P, world_rank()).count);
    if (P > 1) CHECK(st.stage2_count() >= r.count);
  }
  CHECK((P > 1) == (st.stage2() != nullptr));
  CHECK_THROWS_AS(dyn.reduced_shard(count, 8), lowbit::invalid_argument);
  // one shot re-encodes nothing: no second-stage residual to keep
  collective_options one;
  one.algorithm = all_reduce_algorithm::one_shot;
  lowbit::dynamic_all_reduce<float, absmax_nearest, bit_widths<4>, feedback::stage2_only<>,
                             schedule::flat, B>
      shot(harness::comm(), count, one);
  CHECK(shot.feedback_state().stage2() == nullptr);
  CHECK(shot.feedback_state().stage2_count() == 0);
}

TEST_CASE("the frame transport changes how frames move, never the bytes") {
  const std::size_t count = 70001;
  const inputs<float> in(input_kind::normal, count, 901);
  std::vector<float> first(count), out(count);
  for (const auto t : all_frame_transports) {
    INFO(to_string(t));
    collective_options o;
    o.seed = shared_seed() + 901;
    o.transport = t;
    ar<float, C4n, feedback::none, schedule::pipelined<3, 1>> reduce(harness::comm(), count, o);
    CHECK(reduce.options().transport == t);
    if constexpr (std::is_same_v<B, backend::mpi>)
      CHECK(reduce.transport() == frame_transport::automatic);  // MPI has one transport
    else
      CHECK(reduce.transport() != frame_transport::automatic);  // resolved at construction
    harness::call(reduce, in.mine(), out, count);
    if (t == frame_transport::automatic)
      first = out;
    else
      CHECK(std::memcmp(first.data(), out.data(), count * sizeof(float)) == 0);
  }
  CHECK(std::string(to_string(frame_transport::nccl_symmetric)) == "nccl_symmetric");
  CHECK(std::string(to_string(frame_transport::peer_stores)) == "peer_stores");
  CHECK(std::string(to_string(frame_transport::copy_engines)) == "copy_engines");
}

TEST_CASE("bad input throws lowbit::invalid_argument before any byte is sent") {
  const std::size_t count = 1000;
  const inputs<float> in(input_kind::normal, count, 901);
  ar<float, C4n> reduce(harness::comm(), count);
  std::vector<float> out(count);
  CHECK_THROWS_AS(harness::call(reduce, in.mine(), out, count + 1), lowbit::invalid_argument);
  CHECK_THROWS_WITH(harness::call(reduce, in.mine(), out, count + 1), Catch::Contains("max_count"));
  CHECK_THROWS_AS(harness::call_raw(reduce, nullptr, out.data(), count), lowbit::invalid_argument);
  CHECK_THROWS_AS(harness::call_raw(reduce, in.mine().data(), nullptr, count),
                  lowbit::invalid_argument);
  CHECK_NOTHROW(harness::call_raw(reduce, nullptr, nullptr, 0));  // count 0: a no-op
  CHECK_THROWS_AS(harness::call_typed(reduce, in.mine(), out, count, data_type::bfloat16),
                  lowbit::invalid_argument);
  CHECK_THROWS_AS((ar<float, C4n>(harness::empty_comm(), count)), lowbit::invalid_argument);
  rs<float, C4n> scatter(harness::comm(), count);
  CHECK_THROWS_AS(harness::call_raw(scatter, nullptr, out.data(), count), lowbit::invalid_argument);
  // Nothing went out: a valid call now still pairs up with the other ranks.
  CHECK(reduce.step() == 0);
  harness::call(reduce, in.mine(), out, count);
  const auto sim = simulate_all_reduce<C4n>(in.xs, count, 0, 0, reduce_op::sum, reduce.algorithm());
  CHECK(std::memcmp(sim.data(), out.data(), count * sizeof(float)) == 0);
}

TEST_CASE("policy traits") {
  STATIC_REQUIRE(feedback::is_feedback_policy_v<feedback::none>);
  STATIC_REQUIRE(feedback::is_feedback_policy_v<feedback::ef21<>>);
  STATIC_REQUIRE(feedback::is_feedback_policy_v<feedback::residual<__nv_bfloat16>>);
  STATIC_REQUIRE_FALSE(feedback::is_feedback_policy_v<feedback::residual_ref<float>>);
  STATIC_REQUIRE(!std::is_copy_constructible_v<ar<float, C4n>>);
  STATIC_REQUIRE(std::is_move_constructible_v<ar<float, C4n>>);
}

TEST_CASE("workspace is sized at construction: frames of P pieces plus the feedback state") {
  const std::size_t n = 100000;
  ar<float, C4n> plain(harness::comm(), n);
  ar<float, C4n, feedback::residual<>> ef(harness::comm(), n);
  const std::size_t frames = C4n::frame_bytes(n);
  CHECK(plain.workspace_bytes() >= 2 * frames);  // the all-to-all's send and receive sides
  CHECK(plain.workspace_bytes() <= 8 * frames + 4 * n + (1u << 16));
  CHECK(ef.workspace_bytes() >= plain.workspace_bytes() + 4 * n);  // the residual
}

}  // namespace lowbit::test
