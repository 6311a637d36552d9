// Finite in, finite out, on the device: the host's extreme blocks (test/codec/
// extreme_values.hpp: exact +-FLT_MAX, ranges above FLT_MAX, tiny values beside huge
// ones, random exponents) through the CUDA encode and decode kernels give the host's
// frames and decoded values bit for bit, and those values are finite; blocks holding
// inf or nan decode to nan. Every quantizer, grid, width 1..16 and rounding.
#include <cfloat>
#include <cmath>

#include "../codec/extreme_values.hpp"
#include "kernel_test_util.cuh"

namespace lowbit::test {
namespace {

template <class Codec>
void check_extremes(const std::vector<float>& x, std::uint64_t salt) {
  using decoder = codec<typename Codec::quantizer_type>;
  constexpr std::size_t B = Codec::block_size;
  const std::size_t n = x.size();
  const std::size_t fb = Codec::frame_bytes(n);
  const rng_key key{seed() ^ salt, 3, 1, 0};
  INFO("codec " << Codec::quantizer_type::name << " bits " << Codec::bits << " block " << B
                << " rounding " << Codec::rounding_type::name);

  host_frame hf(fb);
  host::encode<Codec>(span<const float>(x.data(), n), hf.bytes(), key);
  device_array<float> dx(n);
  dx.upload(x.data(), n);
  device_array<std::byte> df(fb);
  kernels::encode<Codec>(dx.data(), n, df.data(), key, 0, feedback::none_ref{}, nullptr);
  KT_CUDA(cudaDeviceSynchronize());
  require_same_bytes(hf.data(), df.download(fb), fb, "encoded frame");

  std::vector<float> hy(n);
  host::decode<decoder>(hf.cbytes(), span<float>(hy.data(), n));
  device_array<float> dy(n);
  kernels::decode<decoder>(df.data(), n, dy.data(), 1.0f, nullptr);
  KT_CUDA(cudaDeviceSynchronize());
  const std::vector<float> y = dy.download(n);
  require_same_values(hy, y, "decoded");

  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < n; ++i) {
    bool poisoned = false;
    for (std::size_t k = i / B * B; k < i / B * B + B && k < n; ++k)
      poisoned = poisoned || !std::isfinite(x[k]);
    if (poisoned ? !std::isnan(y[i]) : !std::isfinite(y[i]))
      if (bad++ == 0) first = i;
  }
  INFO(bad << " values bad, the first x[" << first << "] = " << x[first] << " decodes to "
           << y[first]);
  CHECK(bad == 0);
}

template <class Rounding, int Bits>
void integer_quantizers(const std::vector<float>& x, std::uint64_t salt) {
  check_extremes<codec<absmax_full<Bits>, Rounding>>(x, salt + 1);
  check_extremes<codec<absmax_zero<Bits>, Rounding>>(x, salt + 2);
  check_extremes<codec<quant::absmax<Bits, 32>, Rounding>>(x, salt + 3);
  check_extremes<codec<minmax128<Bits>, Rounding>>(x, salt + 4);
}

template <class Rounding, int... Bits>
void every_quantizer(std::integer_sequence<int, Bits...>, const std::vector<float>& x) {
  (integer_quantizers<Rounding, Bits>(x, 100 * Bits), ...);
  check_extremes<codec<quant::fp8<quant::e4m3>, Rounding>>(x, 7);
  check_extremes<codec<quant::fp8<quant::e5m2>, Rounding>>(x, 8);
  check_extremes<codec<quant::fp8<quant::e4m3, 32>, Rounding>>(x, 9);
}

__global__ void ffma_kernel(const float* a, const float* b, const float* c, float* r,
                            std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) r[i] = lowbit::detail::ffma(a[i], b[i], c[i]);
}

}  // namespace

TEST_CASE("extreme finite blocks: device frames and outputs equal the host's, finite",
          "[kernels][extreme]") {
  // Fresh blocks each run; every third block of the second set holds inf, -inf or nan.
  const auto x = extreme_blocks(301, 118);
  const auto poisoned = poison_every_third(extreme_blocks(302, 20));
  SECTION("nearest") {
    every_quantizer<round::nearest>(widths_1_16{}, x);
    every_quantizer<round::nearest>(widths_1_16{}, poisoned);
  }
  SECTION("stochastic") {
    every_quantizer<round::stochastic>(widths_1_16{}, x);
    every_quantizer<round::stochastic>(widths_1_16{}, poisoned);
  }
}

TEST_CASE("detail::ffma rounds once, with the same bits on host and device", "[kernels][extreme]") {
  // Random floats of every exponent, and minmax's decode: small integer codes times a
  // step plus a min, near ties and near FLT_MAX.
  auto g = rng(404);
  const std::size_t n = 1 << 16;
  std::vector<float> a(n), b(n), c(n), host(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 2) {
      a[i] = random_finite(g);
      b[i] = random_finite(g);
      c[i] = random_finite(g);
    } else {
      a[i] = static_cast<float>(g() % 65536);
      b[i] = std::ldexp(1.0f + static_cast<float>(g() % (1u << 23)) * 0x1p-23f,
                        static_cast<int>(g() % 250) - 124);
      c[i] = (g() % 4 == 0) ? -FLT_MAX
                            : std::ldexp(static_cast<float>(g() % 1000) - 500.0f,
                                         static_cast<int>(g() % 250) - 140);
    }
    host[i] = lowbit::detail::ffma(a[i], b[i], c[i]);
  }
  device_array<float> da(n), db(n), dc(n), dr(n);
  da.upload(a.data(), n);
  db.upload(b.data(), n);
  dc.upload(c.data(), n);
  ffma_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(da.data(), db.data(), dc.data(),
                                                               dr.data(), n);
  KT_CUDA(cudaGetLastError());
  KT_CUDA(cudaDeviceSynchronize());
  require_same_values(host, dr.download(n), "ffma");
}

}  // namespace lowbit::test
