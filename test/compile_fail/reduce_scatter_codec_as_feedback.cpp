// A second codec where reduce_scatter takes its feedback policy.
#include <lowbit/collective/reduce_scatter.hpp>
using C = lowbit::codec<lowbit::quant::absmax<4>, lowbit::round::stochastic>;
int main() { return sizeof(lowbit::reduce_scatter<float, C, C>) > 0; }
