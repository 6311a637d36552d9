// Misuse is caught on the host before any launch; count 0 is a no-op.
#include "kernel_test_util.cuh"

namespace lowbit::test {

using C = codec<quant::absmax<4>, round::stochastic>;

TEST_CASE("bad arguments throw lowbit::invalid_argument before launching",
          "[kernels][misuse][sanitize]") {
  device_array<float> x(1000);
  device_array<std::byte> f(C::frame_bytes(1000) + 64);
  const rng_key key{};
  const feedback::none_ref none{};
  std::byte* odd = f.data() + 8;
  REQUIRE_THROWS_AS(
      kernels::encode<C>(static_cast<const float*>(nullptr), 10, f.data(), key, 0, none, nullptr),
      invalid_argument);
  REQUIRE_THROWS_AS(kernels::encode<C>(x.data(), 10, nullptr, key, 0, none, nullptr),
                    invalid_argument);
  REQUIRE_THROWS_AS(kernels::encode<C>(x.data(), 10, odd, key, 0, none, nullptr), invalid_argument);
  REQUIRE_THROWS_AS(kernels::encode<C>(x.data(), 10, f.data(), key, 16, none, nullptr),
                    invalid_argument);
  REQUIRE_THROWS_AS(
      kernels::encode<C>(x.data(), 10, f.data(), key, 0, feedback::residual_ref<float>{}, nullptr),
      invalid_argument);
  REQUIRE_THROWS_AS(kernels::encode<C>(x.data(), 10, f.data(), key, 0, none, nullptr,
                                       kernels::launch_policy{48, 32, 1, 1}),
                    invalid_argument);
  REQUIRE_THROWS_AS(kernels::decode<C>(f.data(), 10, static_cast<float*>(nullptr), 1.0f, nullptr),
                    invalid_argument);
  REQUIRE_THROWS_AS(kernels::decode<C>(nullptr, 10, x.data(), 1.0f, nullptr), invalid_argument);
  REQUIRE_THROWS_AS(kernels::decode<C>(odd, 10, x.data(), 1.0f, nullptr), invalid_argument);

  const std::size_t stride = C::frame_bytes(100);
  REQUIRE_THROWS_AS(kernels::decode_accumulate_encode<C>(f.data(), stride, 0, 100, f.data(), key, 0,
                                                         none, nullptr, nullptr),
                    invalid_argument);
  REQUIRE_THROWS_AS(kernels::decode_accumulate_encode<C>(f.data(), stride - 16, 1, 100, f.data(),
                                                         key, 0, none, nullptr, nullptr),
                    invalid_argument);
  REQUIRE_THROWS_AS(kernels::decode_accumulate_encode<C>(f.data(), stride + 8, 1, 100, f.data(),
                                                         key, 0, none, nullptr, nullptr),
                    invalid_argument);
  REQUIRE_THROWS_AS(kernels::decode_accumulate_encode<C>(f.data(), stride, 1, 100, odd, key, 0,
                                                         none, nullptr, nullptr),
                    invalid_argument);
  REQUIRE_THROWS_AS(kernels::decode_accumulate_encode<C>(f.data(), stride, 1, 100, nullptr, key, 0,
                                                         none, nullptr, nullptr),
                    invalid_argument);
  REQUIRE_THROWS_AS(kernels::decode_accumulate_encode<C>(f.data(), stride, 1, 100, f.data(), key, 8,
                                                         none, x.data(), nullptr),
                    invalid_argument);
  KT_CUDA(cudaDeviceSynchronize());
  REQUIRE(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("count 0 launches nothing and touches nothing", "[kernels][misuse][sanitize]") {
  const rng_key key{};
  kernels::encode<C>(static_cast<const float*>(nullptr), 0, nullptr, key, 0, feedback::none_ref{},
                     nullptr);
  kernels::decode<C>(nullptr, 0, static_cast<__half*>(nullptr), 1.0f, nullptr);
  kernels::decode_accumulate_encode<C>(nullptr, 16, 2, 0, nullptr, key, 0, feedback::none_ref{},
                                       nullptr, nullptr);
  device_array<std::byte> f(64);
  kernels::encode<C>(static_cast<const float*>(nullptr), 0, f.data(), key, 0,
                     feedback::residual_ref<float>{}, nullptr);
  KT_CUDA(cudaDeviceSynchronize());
  const auto bytes = f.download(64);
  for (const std::byte b : bytes) REQUIRE(static_cast<int>(b) == poison_byte);
}

}  // namespace lowbit::test
