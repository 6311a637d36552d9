// Host vs device, bit for bit: absmax on the zero grid, widths 2..16, both roundings,
// float input.
#include "kernel_test_util.cuh"

namespace lowbit::test {

TEST_CASE("absmax zero grid, float: device frames and outputs equal the host's",
          "[kernels][float]") {
  check_widths<absmax_zero, float>(widths_2_16{}, 202);
}

}  // namespace lowbit::test
