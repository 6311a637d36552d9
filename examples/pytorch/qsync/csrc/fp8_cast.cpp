// The fused fp8 cast's entry point (the kernel is fp8_cast.cu): checks what Python hands in
// and binds the function.
#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>

#include <vector>

void fp8_cast_launch(const at::Tensor& x, const at::Tensor& scale, at::ScalarType fmt, double max,
                     at::Tensor& q, at::Tensor* qt);

namespace {

constexpr std::int64_t tile = 64;              // fp8_cast.cu's tile edge
constexpr std::int64_t max_row_tiles = 65535;  // the grid's y extent

// (q, q^T or None): x a contiguous 2-D CUDA tensor of a floating type, scale a 0-d fp32
// tensor on its device.
std::vector<at::Tensor> fp8_cast(const at::Tensor& x, const at::Tensor& scale, at::ScalarType fmt,
                                 double max, bool transposed) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.is_contiguous(),
              "qsync fp8_cast: x must be a contiguous 2-D CUDA tensor, got ", x.sizes(), " on ",
              x.device());
  const auto type = x.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kBFloat16 || type == at::kHalf,
              "qsync fp8_cast: x must be float32, bfloat16 or float16, got ", type);
  TORCH_CHECK(scale.is_cuda() && scale.numel() == 1 && scale.scalar_type() == at::kFloat &&
                  scale.device() == x.device(),
              "qsync fp8_cast: scale must be one fp32 value on x's device");
  TORCH_CHECK(fmt == at::kFloat8_e4m3fn || fmt == at::kFloat8_e5m2,
              "qsync fp8_cast: the format must be float8_e4m3fn or float8_e5m2, got ", fmt);
  TORCH_CHECK((x.size(0) + tile - 1) / tile <= max_row_tiles, "qsync fp8_cast: ", x.size(0),
              " rows are more than the kernel tiles (", max_row_tiles * tile, ")");
  const c10::cuda::CUDAGuard guard(x.device());
  auto q = at::empty(x.sizes(), x.options().dtype(fmt));
  at::Tensor qt;
  if (transposed) qt = at::empty({x.size(1), x.size(0)}, x.options().dtype(fmt));
  if (x.numel() > 0) fp8_cast_launch(x, scale, fmt, max, q, transposed ? &qt : nullptr);
  return {q, transposed ? qt : at::Tensor()};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fp8_cast", &fp8_cast, "fp8(clamp(x / scale)) row-major and optionally transposed",
        pybind11::arg("x"), pybind11::arg("scale"), pybind11::arg("fmt"), pybind11::arg("max"),
        pybind11::arg("transposed"));
}
