// Host vs device, bit for bit: minmax at every width and fp8 (E4M3, E5M2), both
// roundings, float input.
#include "kernel_test_util.cuh"

namespace lowbit::test {

TEST_CASE("minmax, float: device frames and outputs equal the host's", "[kernels][float]") {
  check_widths<minmax128, float>(widths_1_16{}, 503);
}

TEST_CASE("fp8, float: device frames and outputs equal the host's", "[kernels][float]") {
  check_quantizer<lowbit::quant::fp8<lowbit::quant::e4m3>, float>(604);
  check_quantizer<lowbit::quant::fp8<lowbit::quant::e5m2>, float>(705);
}

}  // namespace lowbit::test
