#include <lowbit/codec/codec.hpp>
int main() { return lowbit::codec<lowbit::quant::absmax<4, 100>>::bits; }
