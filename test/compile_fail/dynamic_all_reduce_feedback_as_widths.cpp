// A feedback policy where dynamic_all_reduce takes its set of code widths.
#include <lowbit/collective/all_reduce.hpp>
template <int Bits>
using codec_of = lowbit::codec<lowbit::quant::absmax<Bits>, lowbit::round::stochastic>;
int main() {
  return sizeof(lowbit::dynamic_all_reduce<float, codec_of, lowbit::feedback::residual<>>) > 0;
}
