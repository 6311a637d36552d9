// Host vs device, bit for bit: minmax at every width and fp8 (E4M3, E5M2), both
// roundings, __half input.
#include "kernel_test_util.cuh"

namespace lowbit::test {

TEST_CASE("minmax, half: device frames and outputs equal the host's", "[kernels][half]") {
  check_widths<minmax128, __half>(widths_1_16{}, 503);
}

TEST_CASE("fp8, half: device frames and outputs equal the host's", "[kernels][half]") {
  check_quantizer<lowbit::quant::fp8<lowbit::quant::e4m3>, __half>(604);
  check_quantizer<lowbit::quant::fp8<lowbit::quant::e5m2>, __half>(705);
}

}  // namespace lowbit::test
