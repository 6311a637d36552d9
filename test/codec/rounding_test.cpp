#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "codec_test_util.hpp"
#include "test_random.hpp"

using namespace lowbit;
using lowbit::test::roundtrip;

// Stochastic rounding of x between levels a < b returns b with probability
// p = (x - a)/(b - a): the decoded value has mean x and variance (b-a)^2 p(1-p) <=
// step^2/4. Over N independent trials the mean's standard deviation is at most
// step / (2 sqrt N); we allow 5 of those, plus the 2^-16 step granularity of the
// 16-bit noise.
TEST_CASE("stochastic rounding is unbiased within 5 standard deviations") {
  using C = codec<quant::absmax<3>, round::stochastic>;
  const int trials = 2000;
  auto x = lowbit::test::uniform(256, -1.0f, 1.0f, 17);
  x[0] = 1.0f;  // pins the block scale
  x[128] = -1.0f;
  std::vector<double> mean(x.size(), 0.0);
  float step = 0;
  for (int t = 0; t < trials; ++t) {
    const auto r =
        roundtrip<C>(x, rng_key{lowbit::test::seed(), static_cast<std::uint32_t>(t), 0, 0});
    for (std::size_t i = 0; i < x.size(); ++i) mean[i] += r.y[i] / double(trials);
    step = r.step[1];
  }
  const double tol = 5 * step / (2 * std::sqrt(double(trials))) + step * std::ldexp(1.0, -16);
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("i " << i << " x " << x[i] << " mean " << mean[i] << " tol " << tol);
    REQUIRE(std::fabs(mean[i] - x[i]) <= tol);
  }
}

TEST_CASE("bitscom's case: full(4096, 0.3) with one 1.0 at 2 bits averages to 0.3") {
  using C = codec<quant::absmax<2>, round::stochastic>;
  std::vector<float> x(4096, 0.3f);
  x[0] = 1.0f;
  double sum = 0;
  const int trials = 128;
  for (int t = 0; t < trials; ++t) {
    const auto r =
        roundtrip<C>(x, rng_key{lowbit::test::seed(), static_cast<std::uint32_t>(t), 0, 0});
    for (std::size_t i = 1; i < x.size(); ++i) sum += r.y[i];
  }
  const double m = sum / (trials * (x.size() - 1.0));
  INFO("mean " << m);
  REQUIRE(std::fabs(m - 0.3) < 0.05);
  // A stricter bound than bitscom's: per-value variance 0.25^2*0.2*0.8 = 0.01 per trial.
  REQUIRE(std::fabs(m - 0.3) < 5 * std::sqrt(0.01 / (trials * 4095.0)) + 1e-4);
}

TEST_CASE("same seed gives identical bytes and another step, rank or seed does not") {
  using C = codec<quant::absmax<4>, round::stochastic>;
  const auto x = lowbit::test::normal(5000, 1.0f, 0.0f, 19);
  const auto n = C::frame_bytes(x.size());
  const auto a = roundtrip<C>(x, rng_key{123, 5, 2, 0});
  const auto b = roundtrip<C>(x, rng_key{123, 5, 2, 0});
  REQUIRE(std::memcmp(a.frame.data(), b.frame.data(), n) == 0);
  for (rng_key other : {rng_key{123, 6, 2, 0}, rng_key{124, 5, 2, 0}, rng_key{123, 5, 3, 0},
                        rng_key{123, 5, 2, 1}}) {
    const auto c = roundtrip<C>(x, other);
    REQUIRE(std::memcmp(a.frame.data(), c.frame.data(), n) != 0);
  }
}

TEST_CASE("nearest rounding ignores the key") {
  using C = codec<quant::absmax<4>>;
  const auto x = lowbit::test::normal(777, 1.0f, 0.0f, 23);
  const auto a = roundtrip<C>(x, rng_key{1, 2, 3, 0});
  const auto b = roundtrip<C>(x, rng_key{9, 8, 7, 1});
  REQUIRE(std::memcmp(a.frame.data(), b.frame.data(), C::frame_bytes(x.size())) == 0);
}

TEST_CASE("rounding policies on exact values") {
  REQUIRE(round::nearest::apply(2.5f, 0) == 2.0f);
  REQUIRE(round::nearest::apply(3.5f, 0) == 4.0f);
  REQUIRE(round::nearest::apply(-2.5f, 0) == -2.0f);
  REQUIRE(round::stochastic::apply(2.25f, 0) == 3.0f);           // u = 0 < 0.25
  REQUIRE(round::stochastic::apply(2.25f, 0x4000) == 3.0f - 1);  // u = 0.25, not < 0.25
  REQUIRE(round::stochastic::apply(2.0f, 0) == 2.0f);            // integers never move
  REQUIRE(round::stochastic::apply(-0.75f, 0xffff) == -1.0f);
}

TEST_CASE("stochastic rounding rounds t up to a multiple of 2^-16 first") {
  const float t = 2.25f + std::ldexp(1.0f, -20);  // c mod 2^16 = 0x4001
  REQUIRE(round::stochastic::apply(t, 0x4000) == 3.0f);
  REQUIRE(round::stochastic::apply(t, 0x4001) == 2.0f);
  REQUIRE(round::stochastic::apply(-std::ldexp(1.0f, -30), 0xffff) == 0.0f);  // c = 0
  REQUIRE(round::stochastic::apply(std::ldexp(1.0f, -30), 0) == 1.0f);        // c = 1
  REQUIRE(round::stochastic::apply(std::ldexp(1.0f, -30), 1) == 0.0f);
}

TEST_CASE("to_grid clamps, shifts by exactly 1/2 and returns the index on the grid") {
  // p = -2^-30 with shift -1/2: nearest rounds fadd(p, -1/2) = -1/2, a tie, to 0 (index
  // 8); stochastic takes p + shift + 8 = 7.5 - 2^-30 up to 7.5 and rounds up for half
  // of the noise values.
  const float p = -std::ldexp(1.0f, -30);
  REQUIRE(round::to_grid<round::nearest, -8, 7>(p, -0.5f, 0) == 8u);
  REQUIRE(round::to_grid<round::stochastic, -8, 7>(p, -0.5f, 0x7fff) == 8u);
  REQUIRE(round::to_grid<round::stochastic, -8, 7>(p, -0.5f, 0x8000) == 7u);
  REQUIRE(round::to_grid<round::stochastic, -8, 7>(100.0f, -0.5f, 0) == 15u);
  REQUIRE(round::to_grid<round::stochastic, -8, 7>(-100.0f, -0.5f, 0) == 0u);
  REQUIRE(round::to_grid<round::stochastic, -8, 7>(std::nanf(""), -0.5f, 0) == 0u);
  REQUIRE(round::to_grid<round::nearest, 0, 255>(254.5f, 0.0f, 0) == 254u);
  REQUIRE(round::to_grid<round::stochastic, 0, 65535>(70000.0f, 0.0f, 0) == 65535u);
}

// The encode kernel computes stochastic::index with index_small (an upward-rounded
// addition); the host with exact integer arithmetic. The host's fadd_ru emulates the
// device instruction, so this checks the device formula on the host.
template <int Lo, int Hi>
void check_small_index(float shift) {
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const float lo = static_cast<float>(Lo) - shift, hi = static_cast<float>(Hi) - shift;
  for (int i = 0; i < 200000; ++i) {
    const std::uint64_t r = next();
    float p;
    switch (i % 4) {
      case 0:  // anywhere on the grid
        p = lo + (hi - lo) * static_cast<float>(r >> 40) / 16777216.0f;
        break;
      case 1:  // tiny values of either sign, down to subnormals
        p = std::ldexp(static_cast<float>(r >> 40) / 16777216.0f, -static_cast<int>(r % 149)) *
            ((r >> 8) & 1 ? -1.0f : 1.0f);
        break;
      case 2:  // next to a multiple of 2^-16 or a bound
        p = std::nextafter(
            std::ldexp(std::round(std::ldexp(
                           lo + (hi - lo) * static_cast<float>(r >> 40) / 16777216.0f, 16)),
                       -16),
            (r >> 9) & 1 ? HUGE_VALF : -HUGE_VALF);
        break;
      default:  // outside the grid
        p = (r >> 9) & 1 ? hi + static_cast<float>(r % 1000) : lo - static_cast<float>(r % 1000);
    }
    const auto noise = static_cast<std::uint32_t>(r & 0xffff);
    const float t = std::min(std::max(p, lo), hi);
    INFO("p " << p << " shift " << shift << " noise " << noise);
    REQUIRE(round::stochastic::index_small<Lo>(t, shift, noise) ==
            round::to_grid<round::stochastic, Lo, Hi>(p, shift, noise));
  }
}

TEST_CASE("the device's stochastic index equals the exact one") {
  check_small_index<-8, 7>(-0.5f);
  check_small_index<-7, 7>(0.0f);
  check_small_index<-2, 1>(-0.5f);
  check_small_index<-1, 0>(-0.5f);
  check_small_index<0, 63>(0.0f);
  check_small_index<-32, 31>(-0.5f);
  check_small_index<-64, 63>(-0.5f);
  check_small_index<0, 127>(0.0f);
  check_small_index<-63, 63>(0.0f);
}
