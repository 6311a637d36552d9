// A codec where all_reduce takes its schedule.
#include <lowbit/collective/all_reduce.hpp>
using C = lowbit::codec<lowbit::quant::absmax<4>, lowbit::round::stochastic>;
int main() { return sizeof(lowbit::all_reduce<float, C, lowbit::feedback::none, C>) > 0; }
