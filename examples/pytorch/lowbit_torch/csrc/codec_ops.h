// The codec as tensor functions: encode a tensor to a frame (a uint8 tensor), decode a
// frame, a frame's size. CUDA tensors go through lowbit's kernels, CPU tensors through
// the host codec: both write the same bytes.
#pragma once

#include <torch/extension.h>

#include <cstdint>

#include "common.h"

namespace lowbit_torch {

/// Key of stochastic rounding: what the collectives use for (seed, step, rank).
struct rounding_key {
  std::uint64_t seed = 0;
  std::uint32_t step = 0;
  std::uint32_t rank = 0;
};

/// Instantiated once per element type (the generated codec_<dtype>.cu), so they compile in
/// parallel.
template <class T>
at::Tensor encode_as(const at::Tensor& x, const codec_choice& c, const rounding_key& k);
template <class T>
at::Tensor decode_as(const at::Tensor& frame, std::int64_t count, const codec_choice& c,
                     double scale);

/// Bytes of the frame holding `count` values.
std::int64_t frame_bytes(std::int64_t count, const codec_choice& c);

}  // namespace lowbit_torch
