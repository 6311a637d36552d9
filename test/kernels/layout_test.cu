// Host vs device for the kernels' structure rather than the codec math: block sizes
// that give every lane layout (1, 2, 3, 5, 8 and 32 groups a block), grid-stride loops
// (a one-warp grid), pointers off 16-byte alignment, awkward values, and the big count.
#include "kernel_test_util.cuh"

namespace lowbit::test {

namespace {

template <class Codec, class T>
void check_counts(std::uint64_t salt, std::initializer_list<std::size_t> counts,
                  const kernels::launch_policy* policy = nullptr, std::size_t x_offset = 0) {
  std::uint64_t k = 0;
  for (const std::size_t n : counts) {
    ++k;
    check_encode_decode<Codec, T>(make_values(n, salt + k, values::awkward), salt + 3 * k, policy,
                                  x_offset);
  }
}

}  // namespace

TEST_CASE("every lane layout: blocks of 32, 64, 96, 160, 256 and 1024 values",
          "[kernels][layout][sanitize]") {
  check_counts<codec<quant::absmax<4, 32>, round::stochastic>, float>(11, {1, 33, 1025, 5000});
  check_counts<codec<quant::absmax<3, 64>, round::nearest>, __nv_bfloat16>(12, {1, 65, 3001});
  check_counts<codec<quant::minmax<5, 96>, round::stochastic>, float>(13, {1, 95, 97, 4000});
  check_counts<codec<quant::absmax<7, 160, quant::grid::zero>, round::nearest>, __half>(
      14, {159, 161, 7000});
  check_counts<codec<quant::fp8<quant::e5m2, 256>, round::stochastic>, float>(15, {255, 257, 9000});
  check_counts<codec<quant::absmax<2, 1024>, round::nearest>, float>(16, {1, 1023, 1025, 10000});
  check_counts<codec<quant::minmax<16, 1024>, round::stochastic>, __nv_bfloat16>(17, {2047, 5000});
}

TEST_CASE("a one-warp grid loops over every tile", "[kernels][layout][sanitize]") {
  const kernels::launch_policy tiny{32, 32, 1, 1};
  check_counts<codec<quant::absmax<4>, round::stochastic>, float>(21, {129, 70001}, &tiny);
  check_counts<codec<quant::minmax<3, 96>, round::nearest>, __half>(22, {5000}, &tiny);
  const kernels::launch_policy small{64, 32, 1, 1};
  check_counts<codec<quant::absmax<8, 32>, round::nearest>, __nv_bfloat16>(23, {33333}, &small);
}

TEST_CASE("inputs and outputs off 16-byte alignment take the element-wise path",
          "[kernels][layout][sanitize]") {
  check_counts<codec<quant::absmax<4>, round::stochastic>, float>(31, {1, 129, 70001}, nullptr, 1);
  check_counts<codec<quant::absmax<5>, round::nearest>, __nv_bfloat16>(32, {4099}, nullptr, 3);
  check_counts<codec<quant::fp8<quant::e4m3>>, __half>(33, {4099}, nullptr, 7);
  check_counts<codec<quant::minmax<6, 96>, round::stochastic>, float>(34, {4099}, nullptr, 2);
}

TEST_CASE("a block holding inf or nan decodes to nan and finite blocks stay finite",
          "[kernels][layout][sanitize]") {
  using C = codec<quant::absmax<4>>;
  std::vector<float> x = make_values(1024, 41, values::normal);
  x[5] = INFINITY;
  x[300] = NAN;
  x[700] = -INFINITY;
  host_frame hf(C::frame_bytes(x.size()));
  device_array<float> dx(x.size());
  dx.upload(x.data(), x.size());
  device_array<std::byte> df(C::frame_bytes(x.size()));
  device_array<float> dy(x.size());
  kernels::encode<C>(dx.data(), x.size(), df.data(), rng_key{}, 0, feedback::none_ref{}, nullptr);
  kernels::decode<C>(df.data(), x.size(), dy.data(), 1.0f, nullptr);
  KT_CUDA(cudaDeviceSynchronize());
  const auto y = dy.download(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t b = i / 128;
    const bool poisoned = b == 0 || b == 2 || b == 5;
    INFO("element " << i);
    REQUIRE((y[i] != y[i]) == poisoned);
  }
  check_encode_decode<C, float>(x, 42);
}

TEST_CASE("10^7 + 3 values", "[kernels][big]") {
  const std::size_t n = 10000003;
  check_encode_decode<codec<quant::absmax<4>, round::nearest>, float>(
      make_values(n, 51, values::normal), 52);
  check_encode_decode<codec<quant::absmax<4>, round::stochastic>, __nv_bfloat16>(
      make_values(n, 53, values::awkward), 54);
  check_encode_decode<codec<quant::minmax<3>, round::stochastic>, __half>(
      make_values(n, 55, values::normal), 56);
  check_encode_decode<codec<quant::fp8<quant::e4m3>, round::nearest>, float>(
      make_values(n, 57, values::awkward), 58);
}

}  // namespace lowbit::test
