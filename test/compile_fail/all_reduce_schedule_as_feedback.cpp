// A schedule where all_reduce takes its feedback policy.
#include <lowbit/collective/all_reduce.hpp>
using C = lowbit::codec<lowbit::quant::absmax<4>, lowbit::round::stochastic>;
int main() { return sizeof(lowbit::all_reduce<float, C, lowbit::schedule::pipelined<4>>) > 0; }
