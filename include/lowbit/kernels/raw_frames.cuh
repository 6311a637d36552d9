// Frames of raw values (no quantization): a header, then values of T. What a device
// backend's full-precision stage moves when it has no collective of its own to call (the
// node backend's node-local stage of a hierarchical collective): copies of pieces into and
// out of frames, and the rank-order fp32 sum of P frames, the same sum, to the bit, as the
// host backend's (collective/detail/hierarchical_mpi.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "lowbit/codec/frame_header.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/float_ops.hpp"
#include "lowbit/core/numeric.hpp"
#include "lowbit/kernels/detail/launch.cuh"
#include "lowbit/kernels/frame_check.cuh"

namespace lowbit::kernels {

/// The most pieces and headers one raw_copy carries (a launch's parameters; longer lists
/// take several launches).
inline constexpr int raw_max_pieces = 48;
inline constexpr int raw_max_stamps = 32;

/// Copies of pieces of T (n[i] values from src[i] to dst[i]; none overlap), and `stamps`
/// copies of one header written at at[i] (16-byte aligned). Passed by value.
template <class T>
struct raw_copy {
  int pieces = 0;
  const T* src[raw_max_pieces] = {};
  T* dst[raw_max_pieces] = {};
  std::size_t n[raw_max_pieces] = {};
  int stamps = 0;
  std::byte* at[raw_max_stamps] = {};
  lowbit::detail::frame_header header;
};

namespace detail {

template <class T>
__global__ void raw_copy_kernel(const raw_copy<T> c, const header_check check) {
  if (!frames_agree(check)) return;
  if (blockIdx.x == 0 && static_cast<int>(threadIdx.x) < c.stamps)
    store_header(c.at[threadIdx.x], c.header);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (int p = 0; p < c.pieces; ++p)
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
         i < c.n[p]; i += stride)
      c.dst[p][i] = c.src[p][i];
}

template <class T>
__global__ void raw_sum_kernel(const std::byte* __restrict__ frames, std::size_t stride,
                               int num_frames, std::size_t n, T* __restrict__ out, float scale,
                               const header_check check) {
  if (!frames_agree(check)) return;
  const std::size_t H = sizeof(lowbit::detail::frame_header);
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (int p = 0; p < num_frames; ++p)
      acc = lowbit::detail::fadd(acc, lowbit::to_float(reinterpret_cast<const T*>(
                                          frames + static_cast<std::size_t>(p) * stride + H)[i]));
    out[i] = lowbit::from_float<T>(scale != 1.0f ? lowbit::detail::fmul(acc, scale) : acc);
  }
}

inline unsigned raw_blocks(std::size_t n) {
  const std::size_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 4096 ? 4096 : b));
}

}  // namespace detail

/// Runs `c` on the stream unless a header of `check` disagrees (then nothing is written, and
/// the disagreement is recorded).
template <class T>
void copy_raw(const raw_copy<T>& c, const header_check& check, cudaStream_t stream) {
  if (c.pieces == 0 && c.stamps == 0) return;
  std::size_t widest = 0;
  for (int p = 0; p < c.pieces; ++p) widest = c.n[p] > widest ? c.n[p] : widest;
  detail::raw_copy_kernel<T><<<detail::raw_blocks(widest), 256, 0, stream>>>(c, check);
  LOWBIT_CHECK_LAUNCH();
}

/// out[i] = T(scale * (the fp32 sum, frame 0 first, of value i of each of `num_frames`
/// frames at `frames`, `stride` bytes apart)), i < n, unless a header of `check` disagrees.
template <class T>
void sum_raw_frames(const std::byte* frames, std::size_t stride, int num_frames, std::size_t n,
                    T* out, float scale, const header_check& check, cudaStream_t stream) {
  if (n == 0) return;
  detail::raw_sum_kernel<T>
      <<<detail::raw_blocks(n), 256, 0, stream>>>(frames, stride, num_frames, n, out, scale, check);
  LOWBIT_CHECK_LAUNCH();
}

}  // namespace lowbit::kernels
