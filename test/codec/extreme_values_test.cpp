// Finite in, finite out: blocks that reach +-FLT_MAX (exact +-FLT_MAX elements, ranges
// above FLT_MAX, tiny values beside huge ones, random exponents) decode to finite values
// within the error bound, for every quantizer, grid, width 1..16 and rounding; blocks
// holding inf or nan still decode to nan.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "codec_test_util.hpp"
#include "extreme_values.hpp"
#include "lowbit/codec/codec.hpp"

using namespace lowbit;
using lowbit::test::roundtrip;

namespace {

template <class Codec>
typename Codec::meta_type meta_of(const test::frame_buffer& f, std::size_t i) {
  typename Codec::meta_type m;
  std::memcpy(&m, f.data() + (i / Codec::block_size) * sizeof m, sizeof m);
  return m;
}

template <class Q>
struct is_fp8 : std::false_type {
  using format = void;
};
template <class F, int B>
struct is_fp8<quant::fp8<F, B>> : std::true_type {
  using format = F;
};

/// The error bound of one value. Integer grids: half a step for nearest rounding, one
/// for stochastic, plus float-rounding slack: 2^(b-21) of a step (the scaled position's
/// rounding and a step stepped down by a float or two, times up to 2^b levels), 2^-22 of
/// the value (the decoded value's rounding) and 2^(b-149) (a subnormal step). fp8: half
/// the format's spacing at x (one for stochastic), at most 2^-M of |x| in the normal
/// range and 2^(emin-M) of the scale below it, plus 2^-20 of the value.
template <class Codec>
double bound(const typename Codec::meta_type& m, float x) {
  using Q = typename Codec::quantizer_type;
  const double r = Codec::rounding_type::needs_noise ? 1.0 : 0.5;
  const double ax = std::fabs(static_cast<double>(x));
  if constexpr (is_fp8<Q>::value) {
    using F = typename is_fp8<Q>::format;
    const double s = m.scale;
    return r * (ax * std::ldexp(1.0, -F::man_bits) + s * std::ldexp(1.0, F::emin - F::man_bits)) *
               (1 + 0x1p-20) +
           ax * 0x1p-20;
  } else {
    const double s = std::fabs(static_cast<double>(Q::step(m)));
    return s * (r + std::ldexp(1.0, Codec::bits - 21)) + ax * 0x1p-22 +
           std::ldexp(1.0, Codec::bits - 149);
  }
}

/// Checks every value; reports the first that is not finite or not within the bound
/// (one CHECK per codec, so that one run lists every failing codec).
template <class Codec>
void check_finite(const std::vector<float>& x, std::uint64_t salt) {
  const auto r = roundtrip<Codec>(x, rng_key{test::seed() ^ salt, 5, 2, 1});
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double err = std::fabs(static_cast<double>(r.y[i]) - static_cast<double>(x[i]));
    if (!(std::isfinite(r.y[i]) && err <= bound<Codec>(meta_of<Codec>(r.frame, i), x[i])))
      if (bad++ == 0) first = i;
  }
  INFO(Codec::quantizer_type::name << " bits " << Codec::bits << " block " << Codec::block_size
                                   << " rounding " << Codec::rounding_type::name << ": " << bad
                                   << " values bad, the first x[" << first << "] = " << x[first]
                                   << " decodes to " << r.y[first] << ", step " << r.step[first]);
  CHECK(std::isfinite(r.y[first]));
  CHECK(std::fabs(static_cast<double>(r.y[first]) - static_cast<double>(x[first])) <=
        bound<Codec>(meta_of<Codec>(r.frame, first), x[first]));
}

template <class Codec>
void check_poisoned(const std::vector<float>& x) {
  constexpr std::size_t B = Codec::block_size;
  const auto r = roundtrip<Codec>(x, rng_key{test::seed(), 1, 0, 0});
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    bool poisoned = false;
    for (std::size_t k = i / B * B; k < i / B * B + B && k < x.size(); ++k)
      poisoned = poisoned || !std::isfinite(x[k]);
    if (poisoned ? !std::isnan(r.y[i]) : !std::isfinite(r.y[i]))
      if (bad++ == 0) first = i;
  }
  INFO(Codec::quantizer_type::name << " bits " << Codec::bits << " block " << Codec::block_size
                                   << " rounding " << Codec::rounding_type::name << ": " << bad
                                   << " values bad, the first x[" << first << "] decodes to "
                                   << r.y[first]);
  CHECK(bad == 0);
}

template <int B, class Rounding, template <class> class Check, class... Args>
void integer_quantizers(Args&&... args) {
  Check<codec<quant::absmax<B, 128, quant::grid::full>, Rounding>>::run(args...);
  Check<codec<quant::absmax<B, 128, quant::grid::zero>, Rounding>>::run(args...);
  Check<codec<quant::absmax<B, 32>, Rounding>>::run(args...);
  Check<codec<quant::minmax<B, 128>, Rounding>>::run(args...);
}

template <template <class> class Check, class Rounding, int... B, class... Args>
void every_quantizer(std::integer_sequence<int, B...>, Args&&... args) {
  (integer_quantizers<B + 1, Rounding, Check>(args...), ...);
  Check<codec<quant::fp8<quant::e4m3>, Rounding>>::run(args...);
  Check<codec<quant::fp8<quant::e5m2>, Rounding>>::run(args...);
  Check<codec<quant::fp8<quant::e4m3, 32>, Rounding>>::run(args...);
}

template <class Codec>
struct finite_check {
  static void run(const std::vector<float>& x, std::uint64_t salt) { check_finite<Codec>(x, salt); }
};
template <class Codec>
struct poisoned_check {
  static void run(const std::vector<float>& x) { check_poisoned<Codec>(x); }
};

using widths = std::make_integer_sequence<int, 16>;

}  // namespace

TEST_CASE("finite blocks up to +-FLT_MAX decode to finite values within the bound") {
  const auto x = test::extreme_blocks(101, 118);
  SECTION("nearest") { every_quantizer<finite_check, round::nearest>(widths{}, x, 1); }
  SECTION("stochastic") { every_quantizer<finite_check, round::stochastic>(widths{}, x, 2); }
}

TEST_CASE("blocks holding inf or nan beside +-FLT_MAX still decode to nan") {
  const auto x = test::poison_every_third(test::extreme_blocks(202, 14));
  SECTION("nearest") { every_quantizer<poisoned_check, round::nearest>(widths{}, x); }
  SECTION("stochastic") { every_quantizer<poisoned_check, round::stochastic>(widths{}, x); }
}
