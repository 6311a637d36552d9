#include <lowbit/codec/codec.hpp>
int main() { return sizeof(lowbit::codec<lowbit::quant::absmax<4>, double>); }
