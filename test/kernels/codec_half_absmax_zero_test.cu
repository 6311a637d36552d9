// Host vs device, bit for bit: absmax on the zero grid, widths 2..16, both roundings,
// __half input.
#include "kernel_test_util.cuh"

namespace lowbit::test {

TEST_CASE("absmax zero grid, half: device frames and outputs equal the host's", "[kernels][half]") {
  check_widths<absmax_zero, __half>(widths_2_16{}, 402);
}

}  // namespace lowbit::test
