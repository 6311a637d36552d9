// A backend tag where all_reduce takes its schedule (the backend is the fifth parameter).
#include <lowbit/collective/all_reduce.hpp>
using C = lowbit::codec<lowbit::quant::absmax<4>, lowbit::round::stochastic>;
int main() {
  return sizeof(lowbit::all_reduce<float, C, lowbit::feedback::none, lowbit::backend::mpi>) > 0;
}
