// Host vs device, bit for bit: absmax on the full grid, every width, both roundings,
// __half input.
#include "kernel_test_util.cuh"

namespace lowbit::test {

TEST_CASE("absmax full grid, half: device frames and outputs equal the host's", "[kernels][half]") {
  check_widths<absmax_full, __half>(widths_1_16{}, 301);
}

}  // namespace lowbit::test
