// Host vs device, bit for bit: absmax on the full grid, every width, both roundings,
// float input.
#include "kernel_test_util.cuh"

namespace lowbit::test {

TEST_CASE("absmax full grid, float: device frames and outputs equal the host's",
          "[kernels][float]") {
  check_widths<absmax_full, float>(widths_1_16{}, 101);
}

}  // namespace lowbit::test
