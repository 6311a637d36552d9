// codec_core<T> (core.h) for one element type; included by the generated codec_<dtype>.cu
// only. Without torch: the glue (codec_bindings.cpp) checks the tensors and sizes the frames.
#pragma once

#include <cstddef>

#include "core.h"
#include "lowbit/host/codec_executor.hpp"
#include "lowbit/kernels/decode.cuh"
#include "lowbit/kernels/encode.cuh"

namespace lowbit_torch {

namespace detail {

inline lowbit::rng_key key_of(const rounding_key& k) { return {k.seed, k.step, k.rank, 0}; }

/// Calls f(tag<Codec>{}) for the choice's grid and width at nearest rounding: decoding is
/// the same at either rounding, so only these codecs' decoders are compiled.
template <class F>
void with_decoder(const codec_choice& c, F&& f) {
  with_grid(c, [&](auto g) {
    with_codec_at<typename decltype(g)::type, lowbit::round::nearest>(c.bits, f);
  });
}

}  // namespace detail

template <class T>
void codec_core<T>::encode_device(const T* x, std::size_t count, std::byte* frame,
                                  const codec_choice& c, const rounding_key& k,
                                  cudaStream_t stream) {
  with_codec(c, [&](auto codec) {
    lowbit::kernels::encode<typename decltype(codec)::type, T>(
        x, count, frame, detail::key_of(k), 0, lowbit::feedback::none_ref{}, stream);
  });
}

template <class T>
void codec_core<T>::encode_host(const T* x, std::size_t count, std::byte* frame,
                                std::size_t frame_bytes, const codec_choice& c,
                                const rounding_key& k) {
  with_codec(c, [&](auto codec) {
    lowbit::host::encode<typename decltype(codec)::type, T>({x, count}, {frame, frame_bytes},
                                                            detail::key_of(k));
  });
}

template <class T>
void codec_core<T>::decode_device(const std::byte* frame, std::size_t count, T* out,
                                  const codec_choice& c, float scale, cudaStream_t stream) {
  detail::with_decoder(c, [&](auto codec) {
    lowbit::kernels::decode<typename decltype(codec)::type, T>(frame, count, out, scale, stream);
  });
}

template <class T>
void codec_core<T>::decode_host(const std::byte* frame, std::size_t frame_bytes, std::size_t count,
                                T* out, const codec_choice& c, float scale) {
  detail::with_decoder(c, [&](auto codec) {
    lowbit::host::decode<typename decltype(codec)::type, T>({frame, frame_bytes}, {out, count},
                                                            scale);
  });
}

}  // namespace lowbit_torch
