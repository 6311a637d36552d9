// The full grid's level constructions that the decode kernels use, replayed on the host
// against Quantizer::dequantize: the level of a code left in place in its packed word
// (absmax::level_at, with the chunking of for_each_level), and a sum's first frame as one
// fused multiply-add (absmax::first_sum where first_sum_fusable).
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "lowbit/codec/codec.hpp"
#include "lowbit/core/float_ops.hpp"
#include "test_random.hpp"

using namespace lowbit;
using lowbit::detail::bits_float;
using lowbit::detail::float_bits;

namespace {

/// q + 1/2 of `code` as dequantize forms it (its level before the product by the step).
template <class Q>
float reference_level(std::uint32_t code) {
  return lowbit::detail::fsub(bits_float(Q::level_bits | (code << 1)), Q::level_base);
}

/// level_at<K> for K = Ks..., every code, the word's other bits random.
template <class Q, int... Ks>
void check_places(std::integer_sequence<int, Ks...>) {
  auto g = test::rng(Q::bits);
  std::size_t checked = 0;  // a mismatch fails at once, with its inputs
  (
      [&] {
        constexpr int K = Ks + 1;
        for (std::uint32_t code = 0; code < (1u << Q::bits); ++code) {
          const float ref = reference_level<Q>(code);
          if (ref != static_cast<float>(static_cast<int>(code) - Q::half_levels) + 0.5f)
            FAIL("bits " << Q::bits << " code " << code << ": the reference level is not q + 1/2");
          for (int r = 0; r < (Q::bits <= 8 ? 16 : 1); ++r) {
            const std::uint32_t noise = static_cast<std::uint32_t>(g()) & ~(Q::code_mask << K);
            const std::uint32_t word = noise | (code << K);
            if (float_bits(Q::template level_at<K>(word)) != float_bits(ref)) {
              INFO("bits " << Q::bits << " K " << K << " code " << code << " word " << word);
              REQUIRE(float_bits(Q::template level_at<K>(word)) == float_bits(ref));
            }
            ++checked;
          }
        }
      }(),
      ...);
  REQUIRE(checked == sizeof...(Ks) * (std::size_t{1} << Q::bits) * (Q::bits <= 8 ? 16 : 1));
}

template <int Bits>
void check_places_of_width() {
  using Q = quant::absmax<Bits>;
  check_places<Q>(std::make_integer_sequence<int, 23 - Bits>{});  // K = 1 .. 23 - Bits
}

/// The decoder's walk (for_each_level in kernels/detail/group_decoder.cuh): code i of a
/// group taken from its word shifted by level_chunk_shift, at level_chunk_place.
template <class Q>
float chunked_level(const std::uint32_t* w, int i) {
  const std::uint32_t word = w[i / Q::level_codes_per_word];
  const int j = i % Q::level_codes_per_word;
  const int shift = Q::level_chunk_shift(j);
  const std::uint32_t x = shift == 0 ? word : shift > 0 ? word >> shift : word << -shift;
  switch (j % Q::level_chunk_codes) {
    case 0:
      return Q::template level_at<Q::level_chunk_place(0)>(x);
    case 1:
      if constexpr (Q::level_chunk_codes > 1)
        return Q::template level_at<Q::level_chunk_place(1)>(x);
      break;
    case 2:
      if constexpr (Q::level_chunk_codes > 2)
        return Q::template level_at<Q::level_chunk_place(2)>(x);
      break;
    case 3:
      if constexpr (Q::level_chunk_codes > 3)
        return Q::template level_at<Q::level_chunk_place(3)>(x);
      break;
  }
  return std::numeric_limits<float>::quiet_NaN();
}

template <int Bits>
void check_chunked_groups() {
  using Q = quant::absmax<Bits>;
  using C = codec<Q>;
  STATIC_REQUIRE(Q::level_chunk_codes >= 1);
  STATIC_REQUIRE(Q::level_chunk_codes <= 4);
  STATIC_REQUIRE(Q::level_chunk_place(0) >= 1);
  STATIC_REQUIRE(Q::level_chunk_place(Q::level_chunk_codes - 1) + Bits <= 23);
  auto g = test::rng(100 + Bits);
  for (int r = 0; r < 20000; ++r) {
    std::uint32_t w[Bits];
    for (auto& x : w) x = static_cast<std::uint32_t>(g());
    if (r < 2)
      for (auto& x : w) x = r == 0 ? 0u : ~0u;
    std::uint32_t codes[32];
    C::unpack(w, codes);
    for (int i = 0; i < 32; ++i) {
      if (float_bits(chunked_level<Q>(w, i)) != float_bits(reference_level<Q>(codes[i]))) {
        INFO("bits " << Bits << " i " << i << " code " << codes[i]);
        REQUIRE(float_bits(chunked_level<Q>(w, i)) == float_bits(reference_level<Q>(codes[i])));
      }
    }
  }
}

std::vector<float> steps_to_try() {
  std::vector<float> s = {0.0f,
                          -0.0f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          bits_float(0x7fc12345u),
                          bits_float(0xffc00001u),
                          FLT_MAX,
                          -FLT_MAX,
                          FLT_MIN,
                          std::numeric_limits<float>::denorm_min(),
                          quant::absmax<4>::first_sum_min_step,
                          -quant::absmax<4>::first_sum_min_step};
  for (std::uint32_t u = 1; u < 64; ++u) {  // the smallest subnormals, and near the bounds
    s.push_back(bits_float(u));
    s.push_back(bits_float(0x7f7fffffu - u));
    s.push_back(bits_float(0x02000000u + u - 32));  // around 2^-124
    s.push_back(bits_float(0x00800000u + u - 32));  // around FLT_MIN
  }
  for (int e = -149; e <= 127; ++e) {
    const float p = std::ldexp(1.0f, e);
    s.push_back(p);
    s.push_back(lowbit::detail::float_below(p));
    s.push_back(lowbit::detail::float_above(p));
  }
  auto g = test::rng(7);
  for (int r = 0; r < 20000; ++r) s.push_back(bits_float(static_cast<std::uint32_t>(g())));
  const std::size_t n = s.size();
  for (std::size_t i = 0; i < n; ++i) s.push_back(-s[i]);
  return s;
}

template <int Bits>
void check_first_sums(const std::vector<float>& steps) {
  using Q = quant::absmax<Bits>;
  std::size_t fused = 0, excluded = 0;  // a mismatch fails at once, with its inputs
  std::uint32_t codes = 1u << Bits;
  const std::uint32_t stride = codes > 4096 ? 7 : 1;  // 16 bits: every 7th code, and the ends
  for (float step : steps) {
    if (!Q::first_sum_fusable(step)) {
      const float a = std::fabs(step);
      if (!(a > 0.0f && a < Q::first_sum_min_step)) FAIL("step " << step << " excluded needlessly");
      ++excluded;
      continue;
    }
    for (std::uint32_t code = 0; code < codes; code += (code + stride < codes ? stride : 1)) {
      const float l = reference_level<Q>(code);
      // The host's sum of one frame: acc = 0.0f, then acc + dequantize(code).
      const float ref = lowbit::detail::fadd(0.0f, Q::dequantize(code, {step}));
      const float got = Q::first_sum(l, step);
      const bool same = std::isnan(ref) ? std::isnan(got) : float_bits(got) == float_bits(ref);
      if (!same) {
        INFO("bits " << Bits << " code " << code << " step " << step << " step bits "
                     << float_bits(step) << " got " << float_bits(got) << " want "
                     << float_bits(ref));
        FAIL("the fused first frame differs from the host's sum");
      }
      ++fused;
    }
  }
  REQUIRE(fused > 0);
  REQUIRE(excluded > 0);  // the subnormal steps of steps_to_try
}

}  // namespace

TEST_CASE("absmax::level_at gives the level of a code at every place in a word") {
  check_places_of_width<1>();
  check_places_of_width<2>();
  check_places_of_width<3>();
  check_places_of_width<4>();
  check_places_of_width<5>();
  check_places_of_width<8>();
  check_places_of_width<11>();
  check_places_of_width<16>();
}

TEST_CASE("the decoders' chunked walk gives dequantize's level of every code of a group") {
  check_chunked_groups<1>();
  check_chunked_groups<2>();
  check_chunked_groups<4>();
  check_chunked_groups<8>();
  check_chunked_groups<16>();
}

TEST_CASE("a sum's first frame as one fused multiply-add has the host's bits where fusable") {
  const auto steps = steps_to_try();
  check_first_sums<1>(steps);
  check_first_sums<2>(steps);
  check_first_sums<3>(steps);
  check_first_sums<4>(steps);
  check_first_sums<8>(steps);
  check_first_sums<16>(steps);
}

TEST_CASE("the first-frame fusion is not bit-exact for the steps it excludes") {
  // -1/2 times the smallest subnormal rounds to -0: the host's 0 + (-0) is +0, the fused
  // multiply-add keeps -0. first_sum_fusable must exclude it.
  using Q = quant::absmax<4>;
  const float step = std::numeric_limits<float>::denorm_min();
  const float l = -0.5f;
  REQUIRE(float_bits(Q::first_sum(l, step)) == 0x80000000u);
  REQUIRE(float_bits(lowbit::detail::fadd(0.0f, lowbit::detail::fmul(l, step))) == 0u);
  REQUIRE_FALSE(Q::first_sum_fusable(step));
  REQUIRE_FALSE(Q::first_sum_fusable(-step));
  REQUIRE(Q::first_sum_fusable(0.0f));
  REQUIRE(Q::first_sum_fusable(-0.0f));
  REQUIRE(Q::first_sum_fusable(std::numeric_limits<float>::quiet_NaN()));
  REQUIRE(Q::first_sum_fusable(Q::first_sum_min_step));
  REQUIRE_FALSE(Q::first_sum_fusable(lowbit::detail::float_below(Q::first_sum_min_step)));
}
