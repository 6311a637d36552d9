#include <catch2/catch.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>
#include <vector>

#include "codec_test_util.hpp"
#include "lowbit/codec/codec.hpp"
#include "test_random.hpp"

using namespace lowbit;
using lowbit::test::roundtrip;

namespace {

// Nearest rounding is within half a step; stochastic within one step. The slack covers
// the float rounding of x/step (relative 2^-24 of |x/step| <= 2^(b-1)), of the decoded
// value, and of a subnormal step (off by up to 2^-150, times |q| <= 2^(b-1)).
template <class Codec>
double bound(float step, float x, bool stochastic) {
  const double s = std::fabs(static_cast<double>(step));
  return s * ((stochastic ? 1.0 : 0.5) + std::ldexp(1.0, Codec::bits - 23)) +
         std::fabs(static_cast<double>(x)) * std::ldexp(1.0, -22) +
         std::ldexp(1.0, Codec::bits - 149);
}

template <class Codec>
void check_bound(const std::vector<float>& x) {
  constexpr bool sr = Codec::rounding_type::needs_noise;
  const auto r = roundtrip<Codec>(x, rng_key{lowbit::test::seed(), 3, 1, 0});
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO(Codec::quantizer_type::name << " bits " << Codec::bits << " i " << i << " x " << x[i]
                                     << " y " << r.y[i] << " step " << r.step[i]);
    REQUIRE(std::fabs(static_cast<double>(r.y[i]) - x[i]) <= bound<Codec>(r.step[i], x[i], sr));
  }
}

template <int B, class Rounding>
void check_integer_quantizers(const std::vector<float>& x) {
  check_bound<codec<quant::absmax<B>, Rounding>>(x);
  check_bound<codec<quant::absmax<B, 128, quant::grid::zero>, Rounding>>(x);
  check_bound<codec<quant::minmax<B>, Rounding>>(x);
  check_bound<codec<quant::absmax<B, 32>, Rounding>>(x);
}

template <class Rounding, int... B>
void check_all_widths(const std::vector<float>& x, std::integer_sequence<int, B...>) {
  (check_integer_quantizers<B + 1, Rounding>(x), ...);
}

template <class Codec>
double rms_error(const std::vector<float>& x) {
  const auto r = roundtrip<Codec>(x);
  double s = 0;
  for (std::size_t i = 0; i < x.size(); ++i) s += std::pow(double(r.y[i]) - x[i], 2);
  return std::sqrt(s / x.size());
}

template <int B>
void compare_grids(const std::vector<float>& x) {
  const double full = rms_error<codec<quant::absmax<B, 128, quant::grid::full>>>(x);
  const double zero = rms_error<codec<quant::absmax<B, 128, quant::grid::zero>>>(x);
  std::printf("  %2d bits  rms error  full grid %.6f   zero grid %.6f   ratio %.3f\n", B, full,
              zero, full / zero);
  CHECK(full < zero);
}

}  // namespace

TEST_CASE("integer quantizers stay within the step bound for every width 1..16") {
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 127, 128, 129, 20001);
  auto x = lowbit::test::normal(n, 2.0f, 0.3f, n);
  x[n / 2] = 9.0f;  // an outlier in one block
  SECTION("nearest") { check_all_widths<round::nearest>(x, std::make_integer_sequence<int, 16>{}); }
  SECTION("stochastic") {
    check_all_widths<round::stochastic>(x, std::make_integer_sequence<int, 16>{});
  }
}

TEST_CASE("fp8 quantizers stay within half an fp8 ulp") {
  auto x = lowbit::test::normal(4099, 1.0f, 0.0f, 7);
  auto check = [&](auto codec_tag, int man_bits, int emin) {
    using C = decltype(codec_tag);
    const auto r = roundtrip<C>(x);
    for (std::size_t i = 0; i < x.size(); ++i) {
      typename C::meta_type m;
      std::memcpy(&m, r.frame.data() + (i / C::block_size) * sizeof m, sizeof m);
      const double scaled = std::fabs(x[i] / m.scale);
      const int e =
          std::max(static_cast<int>(std::floor(std::log2(std::max(scaled, 1e-30)))), emin);
      const double half_ulp = std::ldexp(1.0, e - man_bits - 1) * m.scale;
      INFO("x " << x[i] << " y " << r.y[i]);
      REQUIRE(std::fabs(double(r.y[i]) - x[i]) <= half_ulp * (1 + 1e-5) + 1e-12);
    }
  };
  check(codec<quant::fp8<quant::e4m3>>{}, 3, -6);
  check(codec<quant::fp8<quant::e5m2>>{}, 2, -14);
}

TEST_CASE("fp8 codes decode to the OCP format values") {
  using e4 = quant::fp8<quant::e4m3>;
  using e5 = quant::fp8<quant::e5m2>;
  REQUIRE(e4::fp8_value(0x7e) == 448.0f);  // largest finite E4M3
  REQUIRE(e4::fp8_value(0x38) == 1.0f);
  REQUIRE(e4::fp8_value(0x01) == std::ldexp(1.0f, -9));  // smallest subnormal
  REQUIRE(e4::fp8_value(0xb8) == -1.0f);
  REQUIRE(e5::fp8_value(0x7b) == 57344.0f);  // largest finite E5M2
  REQUIRE(e5::fp8_value(0x3c) == 1.0f);
  REQUIRE(e5::fp8_value(0x01) == std::ldexp(1.0f, -16));
  // Every code round-trips through quantize with scale 1.
  e4::params_type p4 = e4::make_params({1.0f});
  for (std::uint32_t c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // nan encodings are never produced
    const float v = e4::fp8_value(c);
    const std::uint32_t back = e4::quantize<round::nearest>(v, p4, 0);
    REQUIRE(e4::fp8_value(back) == v);
  }
}

TEST_CASE("bitscom's case: linspace(-3, 3, 4096) at 4 bits round-trips within one step") {
  std::vector<float> x(4096);
  for (int i = 0; i < 4096; ++i) x[i] = -3.0f + 6.0f * i / 4095.0f;
  const auto r = roundtrip<codec<quant::absmax<4>>>(x);
  for (std::size_t i = 0; i < x.size(); ++i) {
    REQUIRE(std::fabs(r.y[i] - x[i]) <= r.step[i]);
    REQUIRE(std::fabs(r.y[i] - x[i]) <= 0.5f * r.step[i] * (1 + 1e-6f));
  }
}

TEST_CASE("1 bit keeps the sign under nearest rounding") {
  auto x = lowbit::test::normal(10007, 1.0f, 0.0f, 11);
  const auto r = roundtrip<codec<quant::absmax<1>>>(x);
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("x " << x[i] << " y " << r.y[i]);
    REQUIRE(std::signbit(r.y[i]) == std::signbit(x[i]));
    REQUIRE(std::fabs(r.y[i]) == 0.5f * r.step[i]);  // the scaled sign: +-absmax
  }
}

TEST_CASE("tiny and huge and subnormal blocks round-trip within the bound") {
  for (const float magnitude : {1e-30f, 1e30f, 3e38f, 1e-40f}) {
    auto x = lowbit::test::uniform(1000, -1.0f, 1.0f, 5);
    for (auto& v : x) v *= magnitude;
    INFO("magnitude " << magnitude);
    check_bound<codec<quant::absmax<4>>>(x);
    check_bound<codec<quant::absmax<16>>>(x);
    check_bound<codec<quant::absmax<3, 128, quant::grid::zero>>>(x);
    check_bound<codec<quant::absmax<4>, round::stochastic>>(x);
    check_bound<codec<quant::minmax<4>>>(x);  // at 3e38, max - min is above FLT_MAX
    check_bound<codec<quant::minmax<16>, round::stochastic>>(x);
    const auto r = roundtrip<codec<quant::fp8<quant::e4m3>>>(x);
    for (std::size_t i = 0; i < x.size(); ++i)
      REQUIRE(std::fabs(double(r.y[i]) - x[i]) <= std::fabs(double(x[i])) / 16 + r.step[i] / 64);
  }
}

TEST_CASE("all-zero blocks decode to exact zeros") {
  std::vector<float> x(300, 0.0f);
  auto check = [&](auto tag) {
    using C = decltype(tag);
    const auto r = roundtrip<C>(x);
    for (float y : r.y) REQUIRE(y == 0.0f);
  };
  check(codec<quant::absmax<4>>{});
  check(codec<quant::absmax<4>, round::stochastic>{});
  check(codec<quant::absmax<1>>{});
  check(codec<quant::absmax<2, 128, quant::grid::zero>>{});
  check(codec<quant::minmax<3>>{});
  check(codec<quant::fp8<quant::e5m2>>{});
}

TEST_CASE("the zero grid keeps exact zeros inside non-zero blocks") {
  auto x = lowbit::test::normal(512, 1.0f, 0.0f, 3);
  for (std::size_t i = 0; i < x.size(); i += 3) x[i] = 0.0f;
  const auto r = roundtrip<codec<quant::absmax<4, 128, quant::grid::zero>>>(x);
  for (std::size_t i = 0; i < x.size(); i += 3) REQUIRE(r.y[i] == 0.0f);
}

TEST_CASE("a block holding inf or nan decodes to nan and other blocks stay finite") {
  const float bad =
      GENERATE(std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
               std::numeric_limits<float>::quiet_NaN());
  auto x = lowbit::test::normal(128 * 3 + 5, 1.0f, 0.0f, 9);
  x[128 + 17] = bad;
  auto check = [&](auto tag) {
    using C = decltype(tag);
    const auto r = roundtrip<C>(x);
    for (std::size_t i = 0; i < x.size(); ++i) {
      INFO(C::quantizer_type::name << " i " << i);
      if (i / 128 == 1) {
        REQUIRE(std::isnan(r.y[i]));
      } else {
        REQUIRE(std::isfinite(r.y[i]));
      }
    }
  };
  check(codec<quant::absmax<4>>{});
  check(codec<quant::absmax<1>, round::stochastic>{});
  check(codec<quant::absmax<8, 128, quant::grid::zero>>{});
  check(codec<quant::minmax<2>>{});
  check(codec<quant::fp8<quant::e4m3>, round::stochastic>{});
}

TEST_CASE("half and bfloat16 inputs encode like their float values") {
  const auto xf = lowbit::test::normal(1000, 3.0f, 0.0f, 13);
  std::vector<__half> xh;
  std::vector<__nv_bfloat16> xb;
  std::vector<float> xh_f, xb_f;
  for (float v : xf) {
    xh.push_back(from_float<__half>(v));
    xb.push_back(from_float<__nv_bfloat16>(v));
    xh_f.push_back(to_float(xh.back()));
    xb_f.push_back(to_float(xb.back()));
  }
  using C = codec<quant::absmax<4>, round::stochastic>;
  const rng_key key{77, 1, 0, 0};
  const auto a = roundtrip<C>(xh, key), b = roundtrip<C>(xh_f, key);
  REQUIRE(std::memcmp(a.frame.data(), b.frame.data(), C::frame_bytes(xf.size())) == 0);
  const auto c = roundtrip<C>(xb, key), d = roundtrip<C>(xb_f, key);
  REQUIRE(std::memcmp(c.frame.data(), d.frame.data(), C::frame_bytes(xf.size())) == 0);
  // Decoding into half rounds the float result once.
  std::vector<__half> yh(xf.size());
  host::decode<C>(a.frame.cbytes(), span<__half>(yh.data(), yh.size()));
  for (std::size_t i = 0; i < xf.size(); ++i)
    REQUIRE(to_float(yh[i]) == to_float(from_float<__half>(a.y[i])));
}

TEST_CASE("the full grid beats the zero-inclusive grid on Gaussian data") {
  const auto x = lowbit::test::normal(1 << 16, 1.0f, 0.0f, 21);
  compare_grids<2>(x);
  compare_grids<3>(x);
  compare_grids<4>(x);
  compare_grids<6>(x);
}

TEST_CASE("frame size is a function of count alone, 16-byte aligned") {
  using C4 = codec<quant::absmax<4>>;
  STATIC_REQUIRE(C4::frame_bytes(0) == 0);
  STATIC_REQUIRE(C4::frame_bytes(1) == 16 + 64);
  STATIC_REQUIRE(C4::frame_bytes(1000) == 32 + 8 * 64);
  using C3 = codec<quant::minmax<3, 32>>;
  STATIC_REQUIRE(C3::frame_bytes(33) == 48);  // 16 meta + 24 codes, padded to 16
  for (std::size_t n = 0; n < 5000; n += 37) REQUIRE(C3::frame_bytes(n) % 16 == 0);
}

// absmax skips the clamp where it scales by 1/step (lowbit/codec/absmax.hpp): 1/step is
// taken three floats low and the product rounded towards zero, so |x| <= absmax lands in
// [-levels, levels]. Checked at the block's extremes, for absmax across the whole float
// range, every width and both grids; where the step or its reciprocal is not a normal
// float, or the step was taken one float down to keep the outermost level finite, the
// encoder divides instead. One absmax in eight lies within 4096 floats of FLT_MAX.
template <class Q>
void check_positions_in_range(std::mt19937_64& g) {
  for (int i = 0; i < 20000; ++i) {
    float amax;
    if (i % 8 == 0) {
      amax =
          detail::bits_float(detail::float_bits(FLT_MAX) - static_cast<std::uint32_t>(g() % 4096));
    } else {
      do amax = detail::bits_float(static_cast<std::uint32_t>(g()) & 0x7fffffffu);
      while (!(amax > 0.0f && amax <= FLT_MAX));
    }
    quant::block_stats s;
    s.add(amax);
    s.add(-amax);
    const auto p = Q::make_params(Q::make_meta(s));
    INFO(Q::bits << " bits, absmax " << amax << " step " << p.meta.step);
    const float rounded = detail::fdiv(amax, Q::levels);
    const bool overflows = !(detail::fmul(rounded, Q::levels) <= FLT_MAX);
    REQUIRE(p.meta.step == (overflows ? std::nextafter(rounded, 0.0f) : rounded));
    REQUIRE(detail::fmul(p.meta.step, Q::levels) <= FLT_MAX);  // finite in, finite out
    // A step that underflows to 0 codes the block as zeros, and needs no division.
    const bool below_rounded =
        !(detail::fmul(std::nextafter(p.meta.step, HUGE_VALF), Q::levels) <= FLT_MAX);
    REQUIRE(p.divide == !(p.meta.step == 0.0f ||
                          (p.meta.step >= FLT_MIN && p.meta.step <= 0x1p125f && !below_rounded)));
    if (overflows) REQUIRE(p.divide);
    if (!p.divide && p.meta.step > 0.0f) {
      REQUIRE(p.inv_step < 1.0 / p.meta.step);
      REQUIRE(p.inv_step > (1.0 / p.meta.step) * (1 - 0x1p-21));  // a few floats at most
      for (const float x : {amax, -amax, std::nextafter(amax, 0.0f)}) {
        const float pos = detail::fmul_rz(x, p.inv_step);
        REQUIRE(std::fabs(pos) <= Q::levels);
      }
    }
  }
}

template <int... B>
void check_positions_all_widths(std::integer_sequence<int, B...>) {
  auto g = lowbit::test::rng(3);
  (check_positions_in_range<quant::absmax<B + 1>>(g), ...);
  (check_positions_in_range<quant::absmax<B + 1, 128, quant::grid::zero>>(g), ...);
}

TEST_CASE("absmax positions are in the grid without a clamp") {
  check_positions_all_widths(std::make_integer_sequence<int, 16>{});
}

TEST_CASE("a poisoned block codes 0 and decodes to nan") {
  using Q = quant::absmax<4>;
  quant::block_stats s;
  s.add(1.0f);
  s.add(HUGE_VALF);
  const auto m = Q::make_meta(s);
  const auto p = Q::make_params(m);
  REQUIRE(p.divide);
  for (const float x : {1.0f, -0.5f, HUGE_VALF, -HUGE_VALF, std::nanf("")}) {
    REQUIRE(Q::quantize<round::nearest>(x, p, 0) == 0u);
    REQUIRE(Q::quantize<round::stochastic>(x, p, 0xffff) == 0u);
  }
  REQUIRE(std::isnan(Q::dequantize(0, m)));
}

TEST_CASE("1 bit keeps values above FLT_MAX / 2 finite") {
  // Their step, 2 * absmax, would overflow to inf and decode every value to +-inf.
  const std::vector<float> x = {3e38f, -2e38f, 1.0f, -FLT_MAX, 0.0f, 2.5e38f};
  auto check = [&](auto codec_tag) {
    using C = decltype(codec_tag);
    const auto r = roundtrip<C>(x);
    for (std::size_t i = 0; i < x.size(); ++i) {
      INFO(C::rounding_type::name << " x " << x[i] << " y " << r.y[i]);
      REQUIRE(std::isfinite(r.y[i]));
      REQUIRE(std::fabs(static_cast<double>(r.y[i]) - x[i]) <= FLT_MAX);  // one step
      if (std::fabs(x[i]) >= FLT_MAX / 2)  // beyond the outer levels: no rounding choice
        REQUIRE(std::signbit(r.y[i]) == std::signbit(x[i]));
    }
  };
  check(codec<quant::absmax<1>>{});
  check(codec<quant::absmax<1>, round::stochastic>{});
}
