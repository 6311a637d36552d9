// A quantizer template where dynamic_all_reduce takes a width-to-codec template.
#include <lowbit/collective/all_reduce.hpp>
int main() { return sizeof(lowbit::dynamic_all_reduce<float, lowbit::quant::absmax>) > 0; }
