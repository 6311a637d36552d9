// A feedback policy where all_gather takes its schedule (all_gather has no feedback).
#include <lowbit/collective/all_gather.hpp>
using C = lowbit::codec<lowbit::quant::absmax<4>, lowbit::round::stochastic>;
int main() { return sizeof(lowbit::all_gather<float, C, lowbit::feedback::residual<float>>) > 0; }
