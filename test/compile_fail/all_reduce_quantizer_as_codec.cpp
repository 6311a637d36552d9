// A quantizer where all_reduce takes a codec (a quantizer with a rounding policy).
#include <lowbit/collective/all_reduce.hpp>
int main() { return sizeof(lowbit::all_reduce<float, lowbit::quant::absmax<4>>) > 0; }
