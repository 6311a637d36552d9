#include <lowbit/codec/codec.hpp>
int main() { return sizeof(lowbit::codec<int>); }
