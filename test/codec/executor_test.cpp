#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "codec_test_util.hpp"
#include "test_random.hpp"

using namespace lowbit;
using lowbit::test::frame_buffer;

using C = codec<quant::absmax<4>, round::stochastic>;

TEST_CASE("a block-aligned shard encodes exactly as inside the whole tensor") {
  const auto x = lowbit::test::normal(1000, 1.0f, 0.0f, 29);
  const rng_key key{5, 1, 0, 0};
  frame_buffer whole(C::frame_bytes(x.size()));
  host::encode<C>(span<const float>(x.data(), x.size()), whole.bytes(), key);
  // Shard = blocks 2..5 (elements 256..767).
  frame_buffer shard(C::frame_bytes(512));
  host::encode<C>(span<const float>(x.data() + 256, 512), shard.bytes(), key, 256);
  std::vector<float> a(512), b(x.size());
  host::decode<C>(shard.cbytes(), span<float>(a.data(), 512));
  host::decode<C>(whole.cbytes(), span<float>(b.data(), b.size()));
  for (int i = 0; i < 512; ++i) REQUIRE(a[i] == b[256 + i]);
}

TEST_CASE("classic error feedback: the residual is exactly what was not sent") {
  using N = codec<quant::absmax<2>>;
  const auto x = lowbit::test::normal(700, 1.0f, 0.0f, 31);
  std::vector<float> e(x.size(), 0.0f), y(x.size());
  frame_buffer f(N::frame_bytes(x.size()));
  for (int step = 0; step < 3; ++step) {
    const auto e_before = e;
    host::encode<N>(span<const float>(x.data(), x.size()), f.bytes(), {}, 0,
                    feedback::residual_ref<float>{e.data()});
    host::decode<N>(f.cbytes(), span<float>(y.data(), y.size()));
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float c = x[i] + e_before[i];
      REQUIRE(e[i] == c - y[i]);
    }
  }
}

TEST_CASE("classic error feedback: the running mean of a constant input converges") {
  using N = codec<quant::absmax<2>>;
  auto x = lowbit::test::normal(256, 1.0f, 0.0f, 37);
  std::vector<float> e(x.size(), 0.0f), y(x.size());
  std::vector<double> sum(x.size(), 0.0);
  frame_buffer f(N::frame_bytes(x.size()));
  const int steps = 400;
  for (int s = 0; s < steps; ++s) {
    host::encode<N>(span<const float>(x.data(), x.size()), f.bytes(), {}, 0,
                    feedback::residual_ref<float>{e.data()});
    host::decode<N>(f.cbytes(), span<float>(y.data(), y.size()));
    for (std::size_t i = 0; i < x.size(); ++i) sum[i] += y[i];
  }
  // sum of outputs = steps * x - e_final, and |e| stays under one step: the mean's
  // error is at most step / steps.
  for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(std::fabs(sum[i] / steps - x[i]) < 0.02);
}

TEST_CASE("EF21 worker state converges to a constant input") {
  using N = codec<quant::absmax<2>>;
  auto x = lowbit::test::normal(256, 1.0f, 0.0f, 41);
  std::vector<float> g(x.size(), 0.0f);
  frame_buffer f(N::frame_bytes(x.size()));
  for (int s = 0; s < 60; ++s)
    host::encode<N>(span<const float>(x.data(), x.size()), f.bytes(), {}, 0,
                    feedback::ef21_ref<float>{g.data()});
  for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(std::fabs(g[i] - x[i]) < 1e-5f);
}

TEST_CASE("bfloat16 residual storage works") {
  using N = codec<quant::absmax<4>>;
  const auto x = lowbit::test::normal(300, 1.0f, 0.0f, 43);
  std::vector<__nv_bfloat16> e(x.size(), from_float<__nv_bfloat16>(0.0f));
  frame_buffer f(N::frame_bytes(x.size()));
  std::vector<float> y(x.size());
  host::encode<N>(span<const float>(x.data(), x.size()), f.bytes(), {}, 0,
                  feedback::residual_ref<__nv_bfloat16>{e.data()});
  host::decode<N>(f.cbytes(), span<float>(y.data(), y.size()));
  for (std::size_t i = 0; i < x.size(); ++i)
    REQUIRE(to_float(e[i]) == to_float(from_float<__nv_bfloat16>(x[i] - y[i])));
}

TEST_CASE("a poisoned block leaves the residual untouched") {
  using N = codec<quant::absmax<4>>;
  auto x = lowbit::test::normal(256, 1.0f, 0.0f, 47);
  x[5] = std::nanf("");
  std::vector<float> e(x.size(), 0.125f);
  frame_buffer f(N::frame_bytes(x.size()));
  host::encode<N>(span<const float>(x.data(), x.size()), f.bytes(), {}, 0,
                  feedback::residual_ref<float>{e.data()});
  for (int i = 0; i < 128; ++i) REQUIRE(e[i] == 0.125f);
  bool changed = false;
  for (int i = 128; i < 256; ++i) changed |= e[i] != 0.125f;
  REQUIRE(changed);
}

TEST_CASE("decode_accumulate_encode sums frames in fp32 and re-encodes") {
  using N = codec<quant::absmax<8>>;
  const std::size_t n = 333, stride = N::frame_bytes(n);
  frame_buffer frames(3 * stride);
  std::vector<std::vector<float>> xs;
  std::vector<float> expect(n, 0.0f), decoded(n);
  for (int p = 0; p < 3; ++p) {
    xs.push_back(lowbit::test::normal(n, 1.0f, 0.0f, 50 + p));
    host::encode<N>(span<const float>(xs[p].data(), n),
                    span<std::byte>(frames.data() + p * stride, stride));
    host::decode<N>(span<const std::byte>(frames.data() + p * stride, stride),
                    span<float>(decoded.data(), n));
    for (std::size_t i = 0; i < n; ++i) expect[i] += decoded[i];
  }
  std::vector<float> acc(n);
  frame_buffer out(stride);
  host::decode_accumulate_encode<N>(frames.data(), stride, 3, span<float>(acc.data(), n),
                                    out.bytes());
  for (std::size_t i = 0; i < n; ++i) REQUIRE(acc[i] == expect[i]);
  host::decode<N>(out.cbytes(), span<float>(decoded.data(), n));
  for (std::size_t i = 0; i < n; ++i) REQUIRE(std::fabs(decoded[i] - expect[i]) < 0.05f);
}

TEST_CASE("runtime misuse throws invalid_argument naming the argument") {
  std::vector<float> x(100, 1.0f);
  frame_buffer f(C::frame_bytes(100));
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const lowbit::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  CHECK_THAT(message([&] { host::encode<C>(span<const float>(nullptr, 100), f.bytes()); }),
             Catch::Contains("x is null"));
  CHECK_THAT(message([&] {
               host::encode<C>(span<const float>(x.data(), 100), span<std::byte>(f.data(), 16));
             }),
             Catch::Contains("frame is too small"));
  CHECK_THAT(message([&] {
               host::encode<C>(span<const float>(x.data(), 100),
                               span<std::byte>(f.data() + 4, f.size() - 16));
             }),
             Catch::Contains("16-byte aligned"));
  CHECK_THAT(message([&] { host::encode<C>(span<const float>(x.data(), 100), f.bytes(), {}, 7); }),
             Catch::Contains("index0"));
  CHECK_THAT(message([&] { host::decode<C>(f.cbytes(), span<float>(nullptr, 100)); }),
             Catch::Contains("out is null"));
  // count 0 is a no-op, even with null pointers.
  REQUIRE_NOTHROW(host::encode<C>(span<const float>(nullptr, 0), span<std::byte>(nullptr, 0)));
  REQUIRE_NOTHROW(host::decode<C>(span<const std::byte>(nullptr, 0), span<float>(nullptr, 0)));
}

TEST_CASE("every byte of a frame is defined: the meta section's padding is zero") {
  // 5 blocks: 20 bytes of absmax meta padded to 32; 3 blocks of minmax: 24 padded to 32.
  auto check = [](auto codec_tag, std::size_t n) {
    using Codec = decltype(codec_tag);
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
    const std::size_t bytes = Codec::frame_bytes(n);
    frame_buffer clean(bytes), dirty(bytes);
    std::memset(dirty.data(), 0xA7, dirty.size());
    host::encode<Codec>(span<const float>(x.data(), n), span<std::byte>(clean.data(), bytes));
    host::encode<Codec>(span<const float>(x.data(), n), span<std::byte>(dirty.data(), bytes));
    const std::size_t meta_end = Codec::num_blocks(n) * sizeof(typename Codec::meta_type);
    REQUIRE(Codec::codes_offset(n) > meta_end);
    for (std::size_t i = meta_end; i < Codec::codes_offset(n); ++i)
      REQUIRE(dirty.data()[i] == std::byte{0});
    REQUIRE(std::memcmp(clean.data(), dirty.data(), bytes) == 0);
  };
  check(codec<quant::absmax<4>>{}, 5 * 128);
  check(codec<quant::absmax<1>>{}, 5 * 128 - 7);
  check(codec<quant::minmax<4>>{}, 3 * 128);
}
