// The fused fp8 cast's entry point (the kernels are fp8_cast.cu): checks what Python hands
// in, allocates the outputs and binds the function.
#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>

#include <vector>

void fp8_cast_launch(const at::Tensor& x, at::ScalarType fmt, double inv_max, double max,
                     at::Tensor& q, at::Tensor* qt, at::Tensor& scale);

namespace {

constexpr std::int64_t tile = 64;              // fp8_cast.cu's tile edge
constexpr std::int64_t max_col_tiles = 65535;  // the grid's y extent
constexpr std::int64_t pad = 16;               // the transpose's row length: a multiple of it

// (q, q^T with its rows padded to a multiple of 16 with zeros, or None, scale): x a
// contiguous 2-D CUDA tensor of a floating type; max the format's largest finite value and
// inv_max its fp32 reciprocal (the scale is amax * inv_max, as qsync.fp8.quantize has it).
std::vector<at::Tensor> fp8_cast(const at::Tensor& x, at::ScalarType fmt, double max,
                                 double inv_max, bool transposed) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.is_contiguous(),
              "qsync fp8_cast: x must be a contiguous 2-D CUDA tensor, got ", x.sizes(), " on ",
              x.device());
  const auto type = x.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kBFloat16 || type == at::kHalf,
              "qsync fp8_cast: x must be float32, bfloat16 or float16, got ", type);
  TORCH_CHECK(fmt == at::kFloat8_e4m3fn || fmt == at::kFloat8_e5m2,
              "qsync fp8_cast: the format must be float8_e4m3fn or float8_e5m2, got ", fmt);
  TORCH_CHECK(max > 0 && inv_max > 0 &&
                  static_cast<float>(max) * static_cast<float>(inv_max) > 0.99f &&
                  static_cast<float>(max) * static_cast<float>(inv_max) < 1.01f,
              "qsync fp8_cast: max ", max, " and inv_max ", inv_max, " are not reciprocals");
  TORCH_CHECK((x.size(1) + tile - 1) / tile <= max_col_tiles, "qsync fp8_cast: ", x.size(1),
              " columns are more than the kernel tiles (", max_col_tiles * tile, ")");
  const c10::cuda::CUDAGuard guard(x.device());
  const auto f8 = x.options().dtype(fmt);
  const std::int64_t rows_t = (x.size(0) + pad - 1) / pad * pad;
  auto q = at::empty(x.sizes(), f8);
  at::Tensor qt;
  if (transposed)
    qt = x.numel() > 0 ? at::empty({x.size(1), rows_t}, f8) : at::zeros({x.size(1), rows_t}, f8);
  if (x.numel() == 0) return {q, qt, at::ones({}, x.options().dtype(at::kFloat))};
  auto scale = at::empty({}, x.options().dtype(at::kFloat));
  fp8_cast_launch(x, fmt, inv_max, max, q, transposed ? &qt : nullptr, scale);
  return {q, qt, scale};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fp8_cast", &fp8_cast,
        "(fp8(clamp(x / scale)), its transpose with rows padded to 16 or None, scale), the "
        "scale max|x| * inv_max (1 where that is not positive)",
        pybind11::arg("x"), pybind11::arg("fmt"), pybind11::arg("max"), pybind11::arg("inv_max"),
        pybind11::arg("transposed"));
}
