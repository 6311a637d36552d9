// The host executor's vectorized and threaded loops against the plain one-element-at-a-
// time reference (reference_executor.hpp): the same frames, decoded values, sums and
// feedback state, byte for byte, for every quantizer, rounding and class of input; and
// the same bytes whatever the number of threads.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "codec_test_util.hpp"
#include "extreme_values.hpp"
#include "reference_executor.hpp"
#include "test_random.hpp"

using namespace lowbit;
using lowbit::test::frame_buffer;

namespace {

bool same_bytes(const frame_buffer& a, const frame_buffer& b, std::size_t bytes) {
  return std::memcmp(a.data(), b.data(), bytes) == 0;
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Inputs of every kind: normal, one-sided with zeros of both signs, all zeros, blocks
/// with inf and nan, subnormals, the extreme blocks; `count` values.
std::vector<float> mixed_input(std::size_t count, std::uint64_t salt) {
  auto g = lowbit::test::rng(salt);
  std::vector<float> x = lowbit::test::normal(count, 1.0f, 0.0f, salt);
  const auto extreme = lowbit::test::extreme_blocks(salt + 1, 4);
  std::uniform_int_distribution<int> kind(0, 11), coin(0, 7);
  for (std::size_t b = 0; b * 128 < count; ++b) {
    const std::size_t lo = b * 128, hi = std::min(count, lo + 128);
    const int k = kind(g);
    for (std::size_t i = lo; i < hi; ++i) {
      const std::size_t j = i - lo;
      switch (k) {
        case 0:
          x[i] = j % 3 == 0 ? (j % 2 ? -0.0f : 0.0f) : std::fabs(x[i]);
          break;
        case 1:
          x[i] = j % 5 == 0 ? (j % 2 ? 0.0f : -0.0f) : -std::fabs(x[i]);
          break;
        case 2:
          x[i] = (j % 2) ? 0.0f : -0.0f;
          break;
        case 3:
          if (j == 17) x[i] = std::numeric_limits<float>::infinity();
          break;
        case 4:
          if (j == 3) x[i] = std::numeric_limits<float>::quiet_NaN();
          break;
        case 5:
          x[i] *= 1e-40f;
          break;  // subnormal
        case 6:
          x[i] = extreme[(b * 128 + j) % extreme.size()];
          break;
        case 7:
          x[i] *= 1e30f;
          break;
        // One-sided with zeros of random signs at random places: the first zero's sign
        // is the block's min (or max), wherever it lies.
        case 8:
          x[i] = coin(g) == 0 ? (coin(g) % 2 ? -0.0f : 0.0f) : std::fabs(x[i]);
          break;
        case 9:
          x[i] = coin(g) == 0 ? (coin(g) % 2 ? -0.0f : 0.0f) : -std::fabs(x[i]);
          break;
        default:
          break;
      }
    }
  }
  return x;
}

template <class Codec>
void check_against_reference(std::size_t count, std::uint64_t salt) {
  const auto x = mixed_input(count, salt);
  const rng_key key{salt * 77 + 1, 3, 1, 0};
  const std::size_t bytes = Codec::frame_bytes(count);
  frame_buffer ref(bytes), fast(bytes);
  std::memset(ref.data(), 0xab, ref.size());
  std::memset(fast.data(), 0xab, fast.size());
  host_reference::encode<Codec>(span<const float>(x.data(), count), ref.bytes(), key, 64);
  host::encode<Codec>(span<const float>(x.data(), count), fast.bytes(), key, 64);
  REQUIRE(same_bytes(ref, fast, bytes));

  std::vector<float> a(count), b(count);
  host_reference::decode<Codec>(ref.cbytes(), span<float>(a.data(), count), 0.25f);
  host::decode<Codec>(fast.cbytes(), span<float>(b.data(), count), 0.25f);
  REQUIRE(same_floats(a, b));

  // Error feedback (classic): the same frame and the same residual.
  std::vector<float> ea = lowbit::test::normal(count, 0.1f, 0.0f, salt + 9), eb = ea;
  host_reference::encode<Codec>(span<const float>(x.data(), count), ref.bytes(), key, 0,
                                feedback::residual_ref<float>{ea.data()});
  host::encode<Codec>(span<const float>(x.data(), count), fast.bytes(), key, 0,
                      feedback::residual_ref<float>{eb.data()});
  REQUIRE(same_bytes(ref, fast, bytes));
  REQUIRE(same_floats(ea, eb));

  // Three frames summed and re-encoded.
  const std::size_t stride = bytes;
  frame_buffer frames(3 * stride);
  for (int p = 0; p < 3; ++p) {
    const auto xp = mixed_input(count, salt + 100 + p);
    host::encode<Codec>(span<const float>(xp.data(), count),
                        span<std::byte>(frames.data() + p * stride, stride), key);
  }
  std::vector<float> acc_a(count), acc_b(count);
  host_reference::decode_accumulate_encode<Codec>(
      frames.data(), stride, 3, span<float>(acc_a.data(), count), ref.bytes(), key, 0);
  host::decode_accumulate_encode<Codec>(frames.data(), stride, 3, span<float>(acc_b.data(), count),
                                        fast.bytes(), key, 0);
  REQUIRE(same_floats(acc_a, acc_b));
  REQUIRE(same_bytes(ref, fast, bytes));

  // decode_accumulate onto a nonzero sum, and sum_frames with a scaled output.
  host_reference::decode_accumulate<Codec>(ref.cbytes(), span<float>(acc_a.data(), count));
  host::decode_accumulate<Codec>(fast.cbytes(), span<float>(acc_b.data(), count));
  REQUIRE(same_floats(acc_a, acc_b));
  std::vector<float> out(count);
  host::sum_frames<Codec>(frames.data(), stride, 3, span<float>(acc_b.data(), count), out.data(),
                          1.0f / 3.0f);
  std::fill(acc_a.begin(), acc_a.end(), 0.0f);
  for (int p = 0; p < 3; ++p)
    host_reference::decode_accumulate<Codec>(
        span<const std::byte>(frames.data() + p * stride, stride),
        span<float>(acc_a.data(), count));
  REQUIRE(same_floats(acc_a, acc_b));
  for (std::size_t i = 0; i < count; ++i) a[i] = detail::fmul(acc_a[i], 1.0f / 3.0f);
  REQUIRE(same_floats(a, out));
}

template <class Q>
void check_both_roundings(std::size_t count, std::uint64_t salt) {
  check_against_reference<codec<Q, round::nearest>>(count, salt);
  check_against_reference<codec<Q, round::stochastic>>(count, salt + 1);
}

}  // namespace

TEST_CASE("the executor matches the reference: absmax, every width, both grids") {
  for (std::size_t count :
       {std::size_t{1}, std::size_t{31}, std::size_t{128}, std::size_t{1000}, std::size_t{12345}}) {
    check_both_roundings<quant::absmax<1>>(count, 1);
    check_both_roundings<quant::absmax<2>>(count, 2);
    check_both_roundings<quant::absmax<3>>(count, 3);
    check_both_roundings<quant::absmax<4>>(count, 4);
    check_both_roundings<quant::absmax<8>>(count, 5);
    check_both_roundings<quant::absmax<15>>(count, 6);
    check_both_roundings<quant::absmax<16>>(count, 7);
    check_both_roundings<quant::absmax<4, 32>>(count, 8);
    check_both_roundings<quant::absmax<4, 128, quant::grid::zero>>(count, 9);
    check_both_roundings<quant::absmax<16, 64, quant::grid::zero>>(count, 10);
    // Blocks whose half is not a power of two (the statistics' halving must fold the rest).
    check_both_roundings<quant::absmax<3, 96>>(count, 11);
    check_both_roundings<quant::absmax<7, 160, quant::grid::zero>>(count, 12);
    check_both_roundings<quant::absmax<2, 1024>>(count, 13);
  }
}

TEST_CASE("the executor matches the reference: minmax and fp8") {
  for (std::size_t count : {std::size_t{5}, std::size_t{1000}, std::size_t{12345}}) {
    check_both_roundings<quant::minmax<1>>(count, 11);
    check_both_roundings<quant::minmax<4>>(count, 12);
    check_both_roundings<quant::minmax<8, 64>>(count, 13);
    check_both_roundings<quant::fp8<quant::e4m3>>(count, 14);
    check_both_roundings<quant::fp8<quant::e5m2, 32>>(count, 15);
  }
}

TEST_CASE("the batched Philox noise is the codec's") {
  const rng_key key{0x123456789abcdefull, 7, 3, 1};
  for (std::uint64_t j0 : {std::uint64_t{0}, std::uint64_t{16}, (std::uint64_t{1} << 32) - 4}) {
    std::uint32_t noise[128];
    host::detail::noise_of<8>(key, j0, noise);
    for (int k = 0; k < 8; ++k) {
      const philox_block r = key.draw(j0 + k);
      for (int m = 0; m < 16; ++m)
        REQUIRE(noise[16 * k + m] == ((((r.w[m / 4] >> (8 * (m % 4))) & 0xffu) << 8) | 0x80u));
    }
  }
}

TEST_CASE("the block product rounded towards zero is fmul_rz") {
  auto g = lowbit::test::rng(21);
  const float edge[] = {0.0f,     -0.0f,  FLT_MIN, -FLT_MIN,    FLT_MAX,
                        -FLT_MAX, 1e-45f, 3.0f,    1.0f / 3.0f, -7.0f};
  for (int r = 0; r < 3000; ++r) {
    float c[128], t[128];
    float inv = lowbit::test::random_finite(g);
    if (r < 100) inv = edge[r % 10];
    for (int i = 0; i < 128; ++i)
      c[i] = (r + i) % 7 == 0 ? edge[(r + i) % 10] : lowbit::test::random_finite(g);
    host::detail::mul_rz(c, inv, t);
    for (int i = 0; i < 128; ++i)
      REQUIRE(detail::float_bits(t[i]) == detail::float_bits(detail::fmul_rz(c[i], inv)));
  }
}

TEST_CASE("threads give the same bytes as one thread, partial blocks included") {
  using C = codec<quant::absmax<4>, round::stochastic>;
  using M = codec<quant::minmax<3, 64>, round::nearest>;
  const std::size_t count = (std::size_t{1} << 20) + 12345;  // ends in a partial block
  const auto x = mixed_input(count, 31);
  const rng_key key{9, 2, 0, 1};
  const host::exec_policy one{1}, many{5, 1 << 16};
  auto check = [&](auto codec_tag) {
    using K = decltype(codec_tag);
    const std::size_t bytes = K::frame_bytes(count);
    frame_buffer a(bytes), b(bytes);
    std::vector<float> ea(count, 0.0f), eb(count, 0.0f);
    host::encode<K>(span<const float>(x.data(), count), a.bytes(), key, 32,
                    feedback::residual_ref<float>{ea.data()}, one);
    host::encode<K>(span<const float>(x.data(), count), b.bytes(), key, 32,
                    feedback::residual_ref<float>{eb.data()}, many);
    REQUIRE(same_bytes(a, b, bytes));
    REQUIRE(same_floats(ea, eb));
    std::vector<float> ya(count), yb(count);
    host::decode<K>(a.cbytes(), span<float>(ya.data(), count), 0.5f, one);
    host::decode<K>(b.cbytes(), span<float>(yb.data(), count), 0.5f, many);
    REQUIRE(same_floats(ya, yb));
    frame_buffer frames(2 * bytes);
    std::memcpy(frames.data(), a.data(), bytes);
    std::memcpy(frames.data() + bytes, b.data(), bytes);
    std::vector<float> sa(count), sb(count);
    host::decode_accumulate_encode<K>(frames.data(), bytes, 2, span<float>(sa.data(), count),
                                      a.bytes(), key, 0, feedback::none_ref{}, one);
    host::decode_accumulate_encode<K>(frames.data(), bytes, 2, span<float>(sb.data(), count),
                                      b.bytes(), key, 0, feedback::none_ref{}, many);
    REQUIRE(same_floats(sa, sb));
    REQUIRE(same_bytes(a, b, bytes));
    // And the default policy (all usable CPUs) agrees with the reference.
    frame_buffer r(bytes);
    host_reference::encode<K>(span<const float>(x.data(), count), r.bytes(), key, 32);
    host::encode<K>(span<const float>(x.data(), count), a.bytes(), key, 32);
    REQUIRE(same_bytes(a, r, bytes));
  };
  check(C{});
  check(M{});
}
