// The host codec with no CUDA anywhere: encode and decode through lowbit::host at two
// widths, built against an installed lowbit by scripts/test.
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <vector>

#include <lowbit/lowbit.hpp>

namespace {

template <class Codec>
float round_trip(const std::vector<float>& x, const char* name) {
  struct alignas(16) chunk {  // frames are 16-byte aligned
    unsigned char b[16];
  };
  std::vector<chunk> storage(Codec::frame_bytes(x.size()) / 16);
  lowbit::span<std::byte> frame(reinterpret_cast<std::byte*>(storage.data()), storage.size() * 16);

  lowbit::host::encode<Codec>(lowbit::span<const float>(x.data(), x.size()), frame,
                              lowbit::rng_key{/*seed=*/7, /*step=*/1, /*rank=*/0});
  std::vector<float> y(x.size());
  lowbit::host::decode<Codec>(lowbit::span<const std::byte>(frame.data(), frame.size()),
                              lowbit::span<float>(y.data(), y.size()));
  float worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::fmax(worst, std::fabs(x[i] - y[i]));
  std::printf("  %-24s %zu floats -> %6zu bytes, max error %.5f\n", name, x.size(), frame.size(),
              worst);
  return worst;
}

}  // namespace

int main() {
  std::vector<float> x(4096);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.003f * i) * 2.0f;

  std::printf("lowbit %s host codec:\n", LOWBIT_VERSION_STRING);
  const float e4 = round_trip<lowbit::codec<lowbit::quant::absmax<4>, lowbit::round::nearest>>(
      x, "absmax<4>, nearest");
  const float e8 = round_trip<lowbit::codec<lowbit::quant::minmax<8>, lowbit::round::stochastic>>(
      x, "minmax<8>, stochastic");
  // absmax<4>: a step is absmax/7 and nearest rounding is off by half a step at most;
  // minmax<8>: range/255 per step, stochastic rounding off by one step at most.
  return e4 <= 2.0f / 7 / 2 * 1.001f && e8 <= 4.0f / 255 * 1.001f ? 0 : 1;
}
