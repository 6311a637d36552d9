// Host vs device, bit for bit: absmax on the full grid, every width, both roundings,
// __nv_bfloat16 input.
#include "kernel_test_util.cuh"

namespace lowbit::test {

TEST_CASE("absmax full grid, bf16: device frames and outputs equal the host's", "[kernels][bf16]") {
  check_widths<absmax_full, __nv_bfloat16>(widths_1_16{}, 301);
}

}  // namespace lowbit::test
