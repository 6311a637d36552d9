// Built against an installed lowbit by scripts/test: proves the package exports
// everything a host program needs.
#include <cstdio>
#include <vector>

#include <lowbit/lowbit.hpp>

int main() {
  std::vector<float> x{0.5f, -1.0f, 0.25f, 2.0f};
  std::printf("lowbit %s: found through find_package\n", LOWBIT_VERSION_STRING);
  return lowbit::numeric_traits<float>::supported && x.size() == 4 ? 0 : 1;
}
