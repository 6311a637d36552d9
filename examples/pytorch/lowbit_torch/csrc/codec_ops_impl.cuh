// encode_as / decode_as for one element type; included by the generated codec_<dtype>.cu
// only.
#pragma once

#include <cstddef>

#include "codec_ops.h"
#include "lowbit/host/codec_executor.hpp"
#include "lowbit/kernels/decode.cuh"
#include "lowbit/kernels/encode.cuh"

namespace lowbit_torch {

namespace detail {

inline void check_codec_tensor(const at::Tensor& t, const char* what, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), what, ": ", name, " is undefined");
  TORCH_CHECK_VALUE(t.is_cuda() || t.is_cpu(), what, ": ", name,
                    " must be a CPU or CUDA tensor, got ", t.device());
  TORCH_CHECK_VALUE(t.is_contiguous(), what, ": ", name, " must be contiguous");
  TORCH_CHECK_VALUE(reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0, what, ": ", name,
                    " must be 16-byte aligned (a fresh tensor is; a slice may not be)");
}

}  // namespace detail

template <class T>
at::Tensor encode_as(const at::Tensor& x, const codec_choice& c, const rounding_key& k) {
  detail::check_codec_tensor(x, "lowbit_torch.encode", "x");
  TORCH_CHECK_TYPE(x.scalar_type() == scalar_type_of<T>(), "lowbit_torch.encode: x has dtype ",
                   x.scalar_type());
  const std::size_t count = static_cast<std::size_t>(x.numel());
  const lowbit::rng_key key{k.seed, k.step, k.rank, 0};
  return with_codec(c, [&](auto codec) {
    using Codec = typename decltype(codec)::type;
    at::Tensor frame = at::empty({static_cast<std::int64_t>(Codec::frame_bytes(count))},
                                 x.options().dtype(at::kByte));
    auto* bytes = reinterpret_cast<std::byte*>(frame.data_ptr());
    if (x.is_cuda()) {
      const c10::cuda::CUDAGuard guard(x.device());
      lowbit::kernels::encode<Codec, T>(data_as<const T>(x), count, bytes, key, 0,
                                        lowbit::feedback::none_ref{}, current_stream());
    } else {
      lowbit::host::encode<Codec, T>({data_as<const T>(x), count},
                                     {bytes, static_cast<std::size_t>(frame.numel())}, key);
    }
    return frame;
  });
}

template <class T>
at::Tensor decode_as(const at::Tensor& frame, std::int64_t count, const codec_choice& c,
                     double scale) {
  detail::check_codec_tensor(frame, "lowbit_torch.decode", "frame");
  TORCH_CHECK_TYPE(frame.scalar_type() == at::kByte,
                   "lowbit_torch.decode: frame must be a uint8 tensor, got ", frame.scalar_type());
  TORCH_CHECK_VALUE(count >= 0, "lowbit_torch.decode: count must be >= 0, got ", count);
  const std::size_t n = static_cast<std::size_t>(count);
  codec_choice nearest = c;  // rounding does not change the frame's layout or its decoding
  nearest.stochastic = false;
  return with_codec(nearest, [&](auto codec) {
    using Codec = typename decltype(codec)::type;
    TORCH_CHECK_VALUE(static_cast<std::size_t>(frame.numel()) == Codec::frame_bytes(n),
                      "lowbit_torch.decode: a frame of ", count, " values at ", c.bits,
                      " bits has ", Codec::frame_bytes(n), " bytes, got ", frame.numel());
    at::Tensor out = at::empty({count}, frame.options().dtype(scalar_type_of<T>()));
    const auto* bytes = reinterpret_cast<const std::byte*>(frame.data_ptr());
    if (frame.is_cuda()) {
      const c10::cuda::CUDAGuard guard(frame.device());
      lowbit::kernels::decode<Codec, T>(bytes, n, data_as<T>(out), static_cast<float>(scale),
                                        current_stream());
    } else {
      lowbit::host::decode<Codec, T>({bytes, static_cast<std::size_t>(frame.numel())},
                                     {data_as<T>(out), n}, static_cast<float>(scale));
    }
    return out;
  });
}

#define LOWBIT_TORCH_INSTANTIATE_CODEC(T)                                                        \
  template at::Tensor encode_as<T>(const at::Tensor&, const codec_choice&, const rounding_key&); \
  template at::Tensor decode_as<T>(const at::Tensor&, std::int64_t, const codec_choice&, double);

}  // namespace lowbit_torch
