// Host vs device, bit for bit: absmax on the zero grid, widths 2..16, both roundings,
// __nv_bfloat16 input.
#include "kernel_test_util.cuh"

namespace lowbit::test {

TEST_CASE("absmax zero grid, bf16: device frames and outputs equal the host's", "[kernels][bf16]") {
  check_widths<absmax_zero, __nv_bfloat16>(widths_2_16{}, 402);
}

}  // namespace lowbit::test
