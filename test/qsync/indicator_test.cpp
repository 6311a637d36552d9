#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "lowbit/qsync/indicator.hpp"

using namespace lowbit::qsync;

namespace {
tensor_stats hand_stats() {
  tensor_stats s;
  s.weight_norm = 2;
  s.weight_absmax = 1.27;  // Sw = 0.01, e_w = 0
  s.input_norm = 3;
  s.input_absmax = 2.54;  // Sv = 0.02, e_v = 1
  s.input_numel = 10;
  s.grad_weight_norm = 0.5;
  s.grad_output_absmax = 1.0;  // e_g = 0
  s.grad_output_numel = 4;
  return s;
}
const double u = std::ldexp(1.0, -18);  // QSync's fp16 factor 2^-18
}  // namespace

TEST_CASE("indicator: int8 by hand") {
  const auto q = op_perturbation(hand_stats(), 8, precision::int8);
  // fwd = (|W| Sv^2 Dv + |X| Sw^2 Dw) / 6 = (2 * 4e-4 * 10 + 3 * 1e-4 * 8) / 6
  REQUIRE(q.forward == Approx((8e-3 + 2.4e-3) / 6));
  // bwd = (|dW| Sv^2 Dv + |X| 2^(2 e_g) 2^-18 Dg) / 6 = (0.5 * 4e-4 * 10 + 3 * u * 4) / 6
  REQUIRE(q.backward == Approx((2e-3 + 12 * u) / 6));
}

TEST_CASE("indicator: fp16 by hand, fp32 is zero") {
  const auto q = op_perturbation(hand_stats(), 8, precision::fp16);
  // fwd = (2 * 2^(2*1) u * 10 + 3 * 2^0 u * 8) / 6 = (80 + 24) u / 6
  REQUIRE(q.forward == Approx(104 * u / 6));
  // bwd = (0.5 * 4u * 10 + 3 * u * 4) / 6 = 32 u / 6
  REQUIRE(q.backward == Approx(32 * u / 6));
  const auto z = op_perturbation(hand_stats(), 8, precision::fp32);
  REQUIRE(z.forward == 0);
  REQUIRE(z.backward == 0);
  // bf16 has 3 fewer mantissa bits than fp16: 2^6 = 64 times the variance (no clipping).
  REQUIRE(op_perturbation(hand_stats(), 8, precision::bf16).forward == Approx(64 * 104 * u / 6));
}

TEST_CASE("indicator: exponents clip to the format's range, and depth weighting") {
  REQUIRE(clipped_exponent(1e6, precision::fp16) == 15);
  REQUIRE(clipped_exponent(1e-9, precision::fp16) == -14);
  REQUIRE(clipped_exponent(1e-9, precision::bf16) == -30);
  REQUIRE(clipped_exponent(0.0, precision::fp16) == -14);
  REQUIRE(clipped_exponent(std::numeric_limits<double>::infinity(), precision::fp16) == 15);
  REQUIRE(clipped_exponent(std::nan(""), precision::fp16) == -14);
  REQUIRE(float_factor(1.0, precision::fp16) == u);
  const perturbation q{1.0, 10.0};
  // gamma (L - depth) fwd + depth bwd with L = 3, depth = 1: 4 * 2 * 1 + 1 * 10.
  REQUIRE(op_score(q, 1, 3) == Approx(18));
  REQUIRE(op_score(q, 0, 3) == Approx(12));
  REQUIRE_THROWS_AS(op_score(q, 3, 3), lowbit::invalid_argument);
}

TEST_CASE("indicator: op_scores depth counts parameter ops only") {
  op a;
  a.name = "a";
  a.kind = op_kind::linear;
  a.param_numel = 8;
  a.stats = hand_stats();
  op r;
  r.name = "r";
  r.kind = op_kind::relu;
  r.inputs = {"a"};
  op b = a;
  b.name = "b";
  b.inputs = {"r"};
  const op_graph g({a, r, b});
  const auto s = op_scores(g);
  const auto q = op_perturbation(hand_stats(), 8, precision::int8);
  REQUIRE(s[0][index_of(precision::int8)] == Approx(4 * 2 * q.forward));
  REQUIRE(s[1][index_of(precision::int8)] == 0);
  REQUIRE(s[2][index_of(precision::int8)] == Approx(4 * 1 * q.forward + q.backward));
  REQUIRE(s[2][index_of(precision::fp32)] == 0);
}

TEST_CASE("communication indicator: codec variance step^2 / 12, twice for two encodes") {
  // 4 bits, amax 1: step = 2 / 16 = 0.125.
  REQUIRE(codec_variance(4, 1.0) == Approx(0.125 * 0.125 / 12));
  REQUIRE(codec_variance(8, 1.0) == Approx(std::pow(2.0 / 256, 2) / 12));
  REQUIRE(codec_variance(16, 1.0) == Approx(std::ldexp(1.0, -14) / 12));  // bf16 step 2^-7
  REQUIRE(codec_variance(32, 1.0) == 0);
  const bucket_stats s{2.0, 1.0, 100};
  REQUIRE(comm_score(s, 4) == Approx(2.0 * (0.125 * 0.125 / 12) * 100 * 2));
  REQUIRE(comm_score(s, 16) == Approx(2.0 * (std::ldexp(1.0, -14) / 12) * 100));
  REQUIRE(comm_score(s, 2) > comm_score(s, 4));
}

TEST_CASE("bucket statistics from weight-gradient norms") {
  op a;
  a.name = "a";
  a.param_numel = 100;
  a.stats.grad_weight_norm = 3;
  op b = a;
  b.name = "b";
  b.param_numel = 300;
  b.stats.grad_weight_norm = 4;
  const op_graph g({a, b});
  const auto s = estimate_bucket_stats(g, {0, 1});
  REQUIRE(s.grad_norm == Approx(5));
  REQUIRE(s.numel == 400);
  REQUIRE(s.block_absmax == Approx(3 * 5 / 20.0));
}
