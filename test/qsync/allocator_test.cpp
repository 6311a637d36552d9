#include <catch2/catch.hpp>

#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "lowbit/qsync/allocator.hpp"
#include "lowbit/qsync/models.hpp"
#include "qsync_fixtures.hpp"
#include "test_random.hpp"

using namespace lowbit::qsync;
using namespace lowbit::qsync::test;
using Catch::Matchers::Contains;

namespace {

// The oracle: every choice of every variable, predicted in full; the feasible one
// with the lowest score.
struct brute_result {
  bool found = false;
  double score = std::numeric_limits<double>::infinity();
  std::size_t plans = 0;
};

brute_result brute_force(const allocation_problem& pb) {
  const auto& vars = pb.variables();
  std::vector<std::size_t> c(vars.size(), 0);
  brute_result best;
  for (;;) {
    ++best.plans;
    const evaluation e = pb.sim().evaluate(pb.to_plan(c));
    const double s = pb.score(c);
    if (pb.feasible(e) && s < best.score) {
      best.score = s;
      best.found = true;
    }
    std::size_t v = 0;
    while (v < vars.size() && ++c[v] == vars[v].scores.size()) c[v++] = 0;
    if (v == vars.size()) break;
  }
  return best;
}

// A random instance with `ops` linear ops in a chain (a random skip edge or two),
// `groups` device groups with random measured times, and buckets over `bits`.
struct instance {
  training_model model;
  cluster hw;
  score_table scores;
};

instance random_instance(std::mt19937_64& rng, int ops, int groups, const std::vector<int>& bits) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  auto chain = linear_chain(ops);
  for (int i = 2; i < ops; ++i)
    if (u(rng) < 0.3) chain[i].inputs.push_back("op" + std::to_string(i - 2));
  // 0.6 MiB of gradients per op with 1 MiB buckets: one bucket per two ops.
  for (auto& o : chain) {
    o.param_numel = 262144.0 * 0.6;
    o.saved_numel = 1e6 * (0.5 + u(rng));
    o.output_numel = 1e5 * (0.5 + u(rng));
  }
  instance in;
  in.model = model_of(chain, 1.0, 1.0);
  in.hw.name = "random";
  in.hw.link = {"l", 0.5 + u(rng), 0.01};
  for (int g = 0; g < groups; ++g) {
    device_group grp;
    grp.device = round_device("dev" + std::to_string(g));
    grp.device.casts = t4_cast_costs();
    grp.device.launch_ms = 0.01 * u(rng);
    if (g == 1) grp.device.precisions = {precision::fp16, precision::fp32};
    grp.count = 1 + static_cast<int>(u(rng) * 3);
    for (const auto& o : chain)
      for (precision p : {precision::int8, precision::fp16, precision::fp32}) {
        const double w = p == precision::fp32 ? 1.0 : p == precision::fp16 ? 0.6 : 0.45;
        grp.measured.set(o.name, p, {w * (0.5 + u(rng)), 2 * w * (0.5 + u(rng))});
      }
    in.hw.groups.push_back(std::move(grp));
  }
  const simulator sim(in.model, in.hw);
  in.scores.ops.assign(groups, std::vector<std::array<double, precision_count>>(ops));
  for (auto& grp : in.scores.ops)
    for (auto& row : grp) {
      row[index_of(precision::int8)] = 1 + 4 * u(rng);
      row[index_of(precision::fp16)] = 0.5 * u(rng);
      row[index_of(precision::fp32)] = 0;
    }
  for (std::size_t k = 0; k < sim.buckets().size(); ++k) {
    std::vector<double> row;
    for (std::size_t j = 0; j < bits.size(); ++j)
      row.push_back(bits[j] == 32 ? 0 : 2.0 * u(rng) / (j + 1));
    in.scores.buckets.push_back(row);
  }
  return in;
}

// Times of the fastest and the slowest uniform plans, to draw targets in between.
std::pair<double, double> time_range(const simulator& sim, const std::vector<int>& bits) {
  double lo = sim.evaluate(fastest_uniform_plan(sim, bits.front())).iteration_ms();
  double hi = sim.evaluate(sim.uniform(precision::fp32, 32)).iteration_ms();
  return {std::min(lo, hi), std::max(lo, hi)};
}

}  // namespace

TEST_CASE("exact solver equals brute force over all plans (random, n <= 8)") {
  auto rng = lowbit::test::rng(61);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  int feasible = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const int groups = 1 + trial % 2;
    const int ops = groups == 1 ? 3 + (trial / 2) % 3 : 2 + (trial / 2) % 2;
    // Three bit-widths on the smaller instances, two on the larger, so that brute force
    // (every plan predicted in full) stays fast under the sanitizers.
    const bool small = groups == 1 ? ops <= 4 : ops == 2;
    const std::vector<int> bits = small ? std::vector<int>{4, 8, 32} : std::vector<int>{4, 32};
    const instance in = random_instance(rng, ops, groups, bits);
    const simulator sim(in.model, in.hw);
    const auto [lo, hi] = time_range(sim, bits);
    const double target = lo + (hi - lo) * u(rng) * 1.2;
    const allocation_problem pb(sim, in.scores, bits, target);
    REQUIRE(pb.variables().size() <= 8);
    INFO("trial " << trial << " ops " << ops << " groups " << groups << " target " << target);
    const brute_result oracle = brute_force(pb);
    if (!oracle.found) {
      REQUIRE_THROWS_WITH(exact_allocate(pb), Contains("no plan meets the target"));
      continue;
    }
    ++feasible;
    const allocation a = exact_allocate(pb);
    REQUIRE(a.score == Approx(oracle.score).margin(1e-12));
    REQUIRE(a.target_met);
    REQUIRE(a.eval.iteration_ms() <= target * (1 + 1e-9));
    REQUIRE(a.evaluations <= oracle.plans);
    REQUIRE(a.score == Approx(pb.score([&] {
              // the returned plan's own score, recomputed from its precisions and bits
              std::vector<std::size_t> c;
              for (const auto& v : pb.variables()) {
                if (v.bucket) {
                  const auto& b = pb.comm_bits();
                  c.push_back(std::find(b.begin(), b.end(), a.result.bucket_bits[v.index]) -
                              b.begin());
                } else {
                  const auto& m = sim.menu(v.group, v.index);
                  c.push_back(std::find(m.begin(), m.end(), a.result.precisions[v.group][v.index]) -
                              m.begin());
                }
              }
              return c;
            }())));
  }
  REQUIRE(feasible >= 10);
}

TEST_CASE("greedy: feasible and no worse than its start, equal to brute force when loose") {
  auto rng = lowbit::test::rng(62);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const std::vector<int> bits = {4, 8, 32};
  for (int trial = 0; trial < 20; ++trial) {
    const int groups = 1 + trial % 2;
    // Two groups get at most 3 ops, so that brute force stays a few thousand plans.
    const int ops = groups == 1 ? 2 + trial % 3 : 2 + (trial / 2) % 2;
    const instance in = random_instance(rng, ops, groups, bits);
    const simulator sim(in.model, in.hw);
    const auto [lo, hi] = time_range(sim, bits);
    INFO("trial " << trial);
    // Start: the fastest uniform plan, lowest bits.
    const double target = lo + (hi - lo) * u(rng);
    const allocation_problem pb(sim, in.scores, bits, target);
    const allocation g = greedy_allocate(pb);
    const plan start = fastest_uniform_plan(sim, bits.front());
    double start_score = 0;
    for (const auto& v : pb.variables()) {
      if (v.bucket) {
        start_score += v.scores[0];
      } else {
        const auto& m = sim.menu(v.group, v.index);
        const auto at = std::find(m.begin(), m.end(), start.precisions[v.group][v.index]);
        start_score += v.scores[static_cast<std::size_t>(at - m.begin())];
      }
    }
    REQUIRE(g.target_met);  // the start meets any target at or above its own time
    REQUIRE(g.eval.iteration_ms() <= target * (1 + 1e-9));
    REQUIRE(g.eval.fits_memory());
    REQUIRE(g.score <= start_score + 1e-12);
    REQUIRE(sim.evaluate(g.result).iteration_ms() == Approx(g.eval.iteration_ms()));
    // With a target no plan can miss, greedy climbs every ladder to the brute-force optimum.
    const allocation_problem loose(sim, in.scores, bits, 10 * hi + 100);
    REQUIRE(greedy_allocate(loose).score == Approx(brute_force(loose).score).margin(1e-12));
  }
}

TEST_CASE("greedy equals brute force where its order is exact: equal costs, binding target") {
  // k identical ops, fp16 or fp32, no casts, no comm: every promotion costs the same
  // time, so the target admits the same number of promotions in any order and taking
  // the largest gains first is optimal.
  auto rng = lowbit::test::rng(63);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 10; ++trial) {
    const int n = 4 + trial % 4;
    device_profile d = round_device();
    d.precisions = {precision::fp16, precision::fp32};
    training_model m = model_of(linear_chain(n));
    cluster hw{"one", {{d, 1, {}}}, {"l", 1, 0}};
    const simulator sim(m, hw);
    score_table s;
    s.ops.assign(1, std::vector<std::array<double, precision_count>>(n));
    for (auto& row : s.ops[0]) row[index_of(precision::fp16)] = u(rng);
    s.buckets.assign(sim.buckets().size(), std::vector<double>{0.0});
    const double t16 = sim.evaluate(sim.uniform(precision::fp16, 32)).iteration_ms();
    const double t32 = sim.evaluate(sim.uniform(precision::fp32, 32)).iteration_ms();
    const double step = (t32 - t16) / n;
    const double target = t16 + step * (0.5 + (trial % (n - 1)));
    const allocation_problem pb(sim, s, {32}, target);
    INFO("n " << n << " target " << target);
    const allocation g = greedy_allocate(pb);
    const allocation e = exact_allocate(pb);
    REQUIRE(g.score == Approx(brute_force(pb).score).margin(1e-12));
    REQUIRE(e.score == Approx(g.score).margin(1e-12));
  }
}

TEST_CASE("allocator respects each device's memory") {
  auto rng = lowbit::test::rng(64);
  const std::vector<int> bits = {4, 32};
  instance in = random_instance(rng, 4, 2, bits);
  // Room for the weights and about half of the activations at fp32 on group 0.
  const simulator probe(in.model, in.hw);
  const double low = probe.evaluate(probe.uniform(precision::int8, 4)).groups[0].memory.total();
  const double high = probe.evaluate(probe.uniform(precision::fp32, 4)).groups[0].memory.total();
  in.hw.groups[0].device.memory_gib = (low + high) / 2 / (1024.0 * 1024.0 * 1024.0);
  const simulator sim(in.model, in.hw);
  const allocation_problem pb(sim, in.scores, bits, 1e9);
  const allocation g = greedy_allocate(pb);
  const allocation e = exact_allocate(pb);
  REQUIRE(g.eval.fits_memory());
  REQUIRE(e.eval.fits_memory());
  REQUIRE(e.score == Approx(brute_force(pb).score).margin(1e-12));
  REQUIRE(e.score <= g.score + 1e-12);
  // The all-fp32 plan would not fit, so the optimum is not all-zero.
  REQUIRE_FALSE(sim.evaluate(sim.uniform(precision::fp32, 32)).fits_memory());
  // Too little memory even for the fastest plan: an error naming the device.
  in.hw.groups[0].device.memory_gib = low / 2 / (1024.0 * 1024.0 * 1024.0);
  const simulator tiny(in.model, in.hw);
  const allocation_problem pt(tiny, in.scores, bits, 1e9);
  REQUIRE_THROWS_WITH(greedy_allocate(pt), Contains("infeasible memory on dev0"));
  REQUIRE_THROWS_WITH(exact_allocate(pt), Contains("no plan meets"));
}

TEST_CASE("an unreachable target returns the fastest start, marked as missed") {
  auto rng = lowbit::test::rng(65);
  const std::vector<int> bits = {4, 32};
  const instance in = random_instance(rng, 3, 1, bits);
  const simulator sim(in.model, in.hw);
  const allocation_problem pb(sim, in.scores, bits, 1e-6);
  const allocation g = greedy_allocate(pb);
  REQUIRE_FALSE(g.target_met);
  REQUIRE(g.result == fastest_uniform_plan(sim, 4));
}

TEST_CASE("built-in models plan within target and memory on the example clusters") {
  const std::vector<int> bits = {4, 8, 16, 32};
  for (const char* cl : {"t4v100", "h200x2"}) {
    const simulator sim(resnet50(8), builtin_cluster(cl));
    const double fastest = sim.evaluate(fastest_uniform_plan(sim, bits.front())).iteration_ms();
    const double target = default_target_ms(sim, bits);
    REQUIRE(default_target_ms(sim, bits) >= fastest);
    const allocation_problem pb(sim, indicator_scores(sim, bits), bits, target);
    const allocation g = greedy_allocate(pb);
    INFO(cl);
    REQUIRE(g.target_met);
    REQUIRE(g.eval.iteration_ms() <= target * (1 + 1e-9));
    REQUIRE(g.eval.fits_memory());
    // No slower than uniform fp32; the exact solver refuses a model this size.
    REQUIRE(g.eval.iteration_ms() <= sim.evaluate(sim.uniform(precision::fp32, 32)).iteration_ms());
    REQUIRE_THROWS_WITH(exact_allocate(pb), Contains("for small instances"));
  }
}

TEST_CASE("a slack over the fastest uniform plan: the most precision within it") {
  // ResNet-50 on one H200 (roofline): the fastest uniform plan is 16-bit; 5% and 15% over
  // its time leave room for some ops at fp32, more at 15%, never over the target.
  const std::vector<int> bits = {32};
  const simulator sim(resnet50(32), builtin_cluster("H200"));
  const plan fastest = fastest_uniform_plan(sim, 32);
  const double t0 = sim.evaluate(fastest).iteration_ms();
  REQUIRE(slack_target_ms(sim, 32, 0.05) == Approx(1.05 * t0));
  REQUIRE_THROWS_WITH(slack_target_ms(sim, 32, -0.1), Contains(">= 0"));
  const score_table scores = indicator_scores(sim, bits);
  double last_score = std::numeric_limits<double>::infinity();
  std::size_t last_fp32 = 0;
  for (double slack : {0.0, 0.05, 0.15, 10.0}) {
    const double target = slack_target_ms(sim, 32, slack);
    const allocation_problem pb(sim, scores, bits, target);
    const allocation a = greedy_allocate(pb);
    INFO("slack " << slack);
    REQUIRE(a.target_met);
    REQUIRE(a.eval.iteration_ms() <= target * (1 + 1e-9));
    REQUIRE(a.score <= last_score);  // more room, no more perturbation
    std::size_t fp32 = 0;
    for (std::size_t i = 0; i < sim.graph().size(); ++i)
      fp32 += sim.graph().at(i).has_params() && a.result.precisions[0][i] == precision::fp32;
    REQUIRE(fp32 >= last_fp32);
    last_score = a.score;
    last_fp32 = fp32;
    if (slack == 0.05) REQUIRE(fp32 > 0);
  }
  // With room for everything the plan is all fp32 (nothing perturbs less).
  REQUIRE(last_score == Approx(0.0).margin(1e-30));
}

TEST_CASE("a fraction of the fastest plan's speed-up over a reference: the fewest ops below it") {
  // ResNet-50 on one H200 (roofline): the fastest uniform plan is 16-bit. Keeping more of
  // its speed-up over uniform fp32 needs more ops below fp32, never fewer, and every plan
  // meets its target. (Hopper's fp8 is the intended use, "80% of fp8's speed-up over
  // bf16"; the built-in H200 prices fp8 slower than bf16 until fp8 is measured there.)
  const std::vector<int> bits = {32};
  const simulator sim(resnet50(32), builtin_cluster("H200"));
  const double t_ref = sim.evaluate(sim.uniform(precision::fp32, 32)).iteration_ms();
  const double t_fast = sim.evaluate(fastest_uniform_plan(sim, 32)).iteration_ms();
  REQUIRE(t_fast < t_ref);
  REQUIRE(speedup_target_ms(sim, 32, 0.0, precision::fp32) == Approx(t_ref));
  REQUIRE(speedup_target_ms(sim, 32, 1.0, precision::fp32) == Approx(t_fast));
  REQUIRE(speedup_target_ms(sim, 32, 0.8, precision::fp32) ==
          Approx(t_ref - 0.8 * (t_ref - t_fast)));
  REQUIRE_THROWS_WITH(speedup_target_ms(sim, 32, 1.5), Contains("[0, 1]"));
  // A reference that is itself the fastest plan: no gap, the target is its time.
  REQUIRE(speedup_target_ms(sim, 32, 0.5, fastest_uniform_plan(sim, 32).precisions[0][0]) ==
          Approx(t_fast));
  const score_table scores = indicator_scores(sim, bits);
  std::size_t last_low = 0;
  double last_score = 0;
  for (double f : {0.0, 0.5, 0.8, 1.0}) {
    const double target = speedup_target_ms(sim, 32, f, precision::fp32);
    const allocation a = greedy_allocate(allocation_problem(sim, scores, bits, target));
    INFO("fraction " << f);
    REQUIRE(a.target_met);
    REQUIRE(a.eval.iteration_ms() <= target * (1 + 1e-9));
    REQUIRE(a.score >= last_score);  // less room, no less perturbation
    std::size_t low = 0;
    for (std::size_t i = 0; i < sim.graph().size(); ++i)
      low += sim.graph().at(i).has_params() && a.result.precisions[0][i] != precision::fp32;
    REQUIRE(low >= last_low);
    if (f == 0.8) REQUIRE(low > 0);
    last_low = low;
    last_score = a.score;
  }
}
