// The codec functions' bindings: encode, decode, frame_bytes. CUDA tensors go through
// lowbit's kernels, CPU tensors through the host codec (codec_core, compiled per element
// type in the generated codec_<dtype>.cu): both write the same bytes.
#include <torch/extension.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "bindings.h"
#include "choices.h"

namespace lowbit_torch {

namespace {

/// Bytes of the frame holding `count` values.
std::int64_t frame_bytes(std::int64_t count, const codec_choice& c) {
  TORCH_CHECK_VALUE(count >= 0, "lowbit_torch.frame_bytes: count must be >= 0, got ", count);
  return with_codec(c, [&](auto codec) {
    return static_cast<std::int64_t>(
        decltype(codec)::type::frame_bytes(static_cast<std::size_t>(count)));
  });
}

void check_codec_tensor(const at::Tensor& t, const char* what, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), what, ": ", name, " is undefined");
  TORCH_CHECK_VALUE(t.is_cuda() || t.is_cpu(), what, ": ", name,
                    " must be a CPU or CUDA tensor, got ", t.device());
  TORCH_CHECK_VALUE(t.is_contiguous(), what, ": ", name, " must be contiguous");
  TORCH_CHECK_VALUE(reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0, what, ": ", name,
                    " must be 16-byte aligned (a fresh tensor is; a slice may not be)");
}

template <class T>
at::Tensor encode_as(const at::Tensor& x, const codec_choice& c, const rounding_key& k) {
  check_codec_tensor(x, "lowbit_torch.encode", "x");
  TORCH_CHECK_TYPE(x.scalar_type() == scalar_type_of<T>(), "lowbit_torch.encode: x has dtype ",
                   x.scalar_type());
  const std::size_t count = static_cast<std::size_t>(x.numel());
  at::Tensor frame = at::empty({frame_bytes(x.numel(), c)}, x.options().dtype(at::kByte));
  auto* bytes = reinterpret_cast<std::byte*>(frame.data_ptr());
  if (x.is_cuda()) {
    const c10::cuda::CUDAGuard guard(x.device());
    codec_core<T>::encode_device(data_as<const T>(x), count, bytes, c, k, current_stream());
  } else {
    codec_core<T>::encode_host(data_as<const T>(x), count, bytes,
                               static_cast<std::size_t>(frame.numel()), c, k);
  }
  return frame;
}

template <class T>
at::Tensor decode_as(const at::Tensor& frame, std::int64_t count, const codec_choice& c,
                     double scale) {
  check_codec_tensor(frame, "lowbit_torch.decode", "frame");
  TORCH_CHECK_TYPE(frame.scalar_type() == at::kByte,
                   "lowbit_torch.decode: frame must be a uint8 tensor, got ", frame.scalar_type());
  TORCH_CHECK_VALUE(count >= 0, "lowbit_torch.decode: count must be >= 0, got ", count);
  const std::size_t n = static_cast<std::size_t>(count);
  const std::int64_t want = frame_bytes(count, c);
  TORCH_CHECK_VALUE(frame.numel() == want, "lowbit_torch.decode: a frame of ", count, " values at ",
                    c.bits, " bits has ", want, " bytes, got ", frame.numel());
  at::Tensor out = at::empty({count}, frame.options().dtype(scalar_type_of<T>()));
  const auto* bytes = reinterpret_cast<const std::byte*>(frame.data_ptr());
  if (frame.is_cuda()) {
    const c10::cuda::CUDAGuard guard(frame.device());
    codec_core<T>::decode_device(bytes, n, data_as<T>(out), c, static_cast<float>(scale),
                                 current_stream());
  } else {
    codec_core<T>::decode_host(bytes, static_cast<std::size_t>(frame.numel()), n, data_as<T>(out),
                               c, static_cast<float>(scale));
  }
  return out;
}

}  // namespace

void bind_codec(pybind11::module_& m) {
  namespace py = pybind11;
  m.def(
      "encode",
      [](const at::Tensor& x, int bits, const std::string& grid, const std::string& rounding,
         std::uint64_t seed, std::uint32_t step, std::uint32_t rank) {
        const codec_choice c = make_codec(bits, grid, rounding);
        const rounding_key k{seed, step, rank};
        at::Tensor frame;
        with_instance<codec_instances>("lowbit_torch.encode", x.scalar_type(), [&](auto t) {
          frame = encode_as<typename decltype(t)::type>(x, c, k);
        });
        return frame;
      },
      py::arg("x"), py::arg("bits"), py::arg("grid"), py::arg("rounding"), py::arg("seed"),
      py::arg("step"), py::arg("rank"));
  m.def(
      "decode",
      [](const at::Tensor& frame, std::int64_t count, int bits, const std::string& grid,
         at::ScalarType dtype, double scale) {
        const codec_choice c = make_codec(bits, grid, "nearest");
        at::Tensor out;
        with_instance<codec_instances>("lowbit_torch.decode", dtype, [&](auto t) {
          out = decode_as<typename decltype(t)::type>(frame, count, c, scale);
        });
        return out;
      },
      py::arg("frame"), py::arg("count"), py::arg("bits"), py::arg("grid"), py::arg("dtype"),
      py::arg("scale"));
  m.def(
      "frame_bytes",
      [](std::int64_t count, int bits, const std::string& grid) {
        return frame_bytes(count, make_codec(bits, grid, "nearest"));
      },
      py::arg("count"), py::arg("bits"), py::arg("grid"));
}

}  // namespace lowbit_torch
