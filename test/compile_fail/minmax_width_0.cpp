#include <lowbit/codec/codec.hpp>
int main() { return lowbit::codec<lowbit::quant::minmax<0>>::bits; }
