#include <cstddef>
#include <lowbit/host/codec_executor.hpp>
int main() {
  using C = lowbit::codec<lowbit::quant::absmax<4>>;
  double x[4] = {};
  alignas(16) std::byte frame[C::frame_bytes(4)];
  lowbit::host::encode<C>(lowbit::span<const double>(x, 4),
                          lowbit::span<std::byte>(frame, sizeof frame));
}
