// Host vs device, bit for bit: minmax at every width and fp8 (E4M3, E5M2), both
// roundings, __nv_bfloat16 input.
#include "kernel_test_util.cuh"

namespace lowbit::test {

TEST_CASE("minmax, bf16: device frames and outputs equal the host's", "[kernels][bf16]") {
  check_widths<minmax128, __nv_bfloat16>(widths_1_16{}, 503);
}

TEST_CASE("fp8, bf16: device frames and outputs equal the host's", "[kernels][bf16]") {
  check_quantizer<lowbit::quant::fp8<lowbit::quant::e4m3>, __nv_bfloat16>(604);
  check_quantizer<lowbit::quant::fp8<lowbit::quant::e5m2>, __nv_bfloat16>(705);
}

}  // namespace lowbit::test
