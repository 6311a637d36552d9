// Host vs device, bit for bit, both roundings, for one element type and one quantizer
// family: absmax on the full grid (every width), absmax on the zero grid (widths 2..16),
// or minmax (every width) with fp8 (E4M3, E5M2). test/kernels/CMakeLists.txt compiles
// this file once per pair, one executable each, defining
//   KT_TYPE       the element type: float, __half or __nv_bfloat16
//   KT_TYPE_NAME  its name in test names and tags: float, half or bf16
//   KT_FAMILY_ABSMAX_FULL, KT_FAMILY_ABSMAX_ZERO or KT_FAMILY_MINMAX
#include "kernel_test_util.cuh"

#if !defined(KT_TYPE) || !defined(KT_TYPE_NAME)
#error "codec_test.cu: define KT_TYPE and KT_TYPE_NAME (see test/kernels/CMakeLists.txt)"
#endif

#define KT_STR_(x) #x
#define KT_STR(x) KT_STR_(x)
#define KT_NAME(family) \
  family ", " KT_STR(KT_TYPE_NAME) ": device frames and outputs equal the host's"
#define KT_TAGS "[kernels][" KT_STR(KT_TYPE_NAME) "]"

namespace lowbit::test {

// The salts (seeds) are those of the former per-type files: absmax has one for float
// and one for the 16-bit types.
#if defined(KT_FAMILY_ABSMAX_FULL)
TEST_CASE(KT_NAME("absmax full grid"), KT_TAGS) {
  check_widths<absmax_full, KT_TYPE>(widths_1_16{}, sizeof(KT_TYPE) == 4 ? 101 : 301);
}
#elif defined(KT_FAMILY_ABSMAX_ZERO)
TEST_CASE(KT_NAME("absmax zero grid"), KT_TAGS) {
  check_widths<absmax_zero, KT_TYPE>(widths_2_16{}, sizeof(KT_TYPE) == 4 ? 202 : 402);
}
#elif defined(KT_FAMILY_MINMAX)
TEST_CASE(KT_NAME("minmax"), KT_TAGS) { check_widths<minmax128, KT_TYPE>(widths_1_16{}, 503); }

TEST_CASE(KT_NAME("fp8"), KT_TAGS) {
  check_quantizer<lowbit::quant::fp8<lowbit::quant::e4m3>, KT_TYPE>(604);
  check_quantizer<lowbit::quant::fp8<lowbit::quant::e5m2>, KT_TYPE>(705);
}
#else
#error "codec_test.cu: define one of KT_FAMILY_ABSMAX_FULL, KT_FAMILY_ABSMAX_ZERO, KT_FAMILY_MINMAX"
#endif

}  // namespace lowbit::test
