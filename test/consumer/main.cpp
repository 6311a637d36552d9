// Built against an installed lowbit by scripts/test; also the README's codec example.
#include <cmath>
#include <cstdio>
#include <vector>

#include <lowbit/lowbit.hpp>

int main() {
  // 4-bit symmetric codes over blocks of 128 values, stochastic rounding.
  using codec = lowbit::codec<lowbit::quant::absmax<4>, lowbit::round::stochastic>;

  std::vector<float> x(1000);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.01f * i);

  // A frame's size depends only on the count: 8 fp32 steps + 8 blocks of 64 bytes.
  struct alignas(16) chunk {
    unsigned char b[16];
  };
  std::vector<chunk> storage(codec::frame_bytes(x.size()) / 16);
  lowbit::span<std::byte> frame(reinterpret_cast<std::byte*>(storage.data()), storage.size() * 16);

  const lowbit::rng_key key{/*seed=*/42, /*step=*/0, /*rank=*/0};
  lowbit::host::encode<codec>(lowbit::span<const float>(x.data(), x.size()), frame, key);

  std::vector<float> y(x.size());
  lowbit::host::decode<codec>(lowbit::span<const std::byte>(frame.data(), frame.size()),
                              lowbit::span<float>(y.data(), y.size()));

  float worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::fmax(worst, std::fabs(x[i] - y[i]));
  std::printf("lowbit %s: %zu floats -> %zu bytes, max error %.4f\n", LOWBIT_VERSION_STRING,
              x.size(), frame.size(), worst);
  return worst < 0.15f ? 0 : 1;  // one step of a block whose absmax is at most 1
}
