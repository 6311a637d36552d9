// The codec functions' bindings: encode, decode, frame_bytes.
#include <torch/extension.h>

#include <cstdint>
#include <string>

#include "choices.h"
#include "codec_ops.h"

namespace lowbit_torch {

std::int64_t frame_bytes(std::int64_t count, const codec_choice& c) {
  TORCH_CHECK_VALUE(count >= 0, "lowbit_torch.frame_bytes: count must be >= 0, got ", count);
  return with_codec(c, [&](auto codec) {
    return static_cast<std::int64_t>(
        decltype(codec)::type::frame_bytes(static_cast<std::size_t>(count)));
  });
}

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
