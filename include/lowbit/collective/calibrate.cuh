// Measuring the crossover: the size below which a collective should hand its call to
// plain NCCL because the codec costs more than the bytes it saves. It depends on the
// link (NVLink, PCIe, network), the element type, the width and the feedback, so it is
// measured on the communicator the collective runs on, not guessed.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "lowbit/collective/detail/device_buffer.cuh"
#include "lowbit/comm/nccl_comm.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/nccl_try.hpp"
#include "lowbit/core/numeric.hpp"

namespace lowbit {
namespace detail {

/// Non-zero calibration data (zeros can run faster than real data).
template <class T>
__global__ void calibration_fill_kernel(T* x, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u;
    x[i] = from_float<T>(static_cast<float>(h >> 8) * (1.0f / 16777216.0f) - 0.5f);
  }
}

}  // namespace detail

/// Times `coll` against the plain NCCL collective at sizes 64 KiB, 128 KiB, ... up to
/// min(max_bytes, coll.max_count() * sizeof(T)), and sets its crossover to the smallest
/// measured size from which the low-bit path is faster at that size and every larger
/// one (past the largest size when it never is). Returns the crossover in bytes.
///
/// Collective over `comm` (the communicator `coll` was built on): every rank calls it
/// with the same arguments, and the ranks agree on the slowest rank's times, so they all
/// take the same path afterwards. It synchronises `stream`, allocates two scratch
/// buffers for its duration, zeroes the feedback state and restores the step: call it
/// once, before training, not inside a captured graph.
template <class Collective>
std::size_t calibrate_crossover(Collective& coll, comm::nccl_comm& comm, cudaStream_t stream,
                                std::size_t max_bytes = std::size_t{256} << 20, int iters = 5) {
  using T = typename Collective::value_type;
  LOWBIT_EXPECTS(iters >= 1, "calibrate_crossover: iters must be >= 1");
  comm.check("calibrate_crossover");
  const std::size_t max_count = std::min(coll.max_count(), max_bytes / sizeof(T));
  std::vector<std::size_t> counts;
  for (std::size_t n = (std::size_t{64} << 10) / sizeof(T); n <= max_count; n *= 2)
    counts.push_back(n);
  const std::size_t never = max_count * sizeof(T) + 1;
  if (counts.empty()) {
    coll.set_crossover_bytes(0);
    return 0;
  }

  detail::device_buffer<T> in(max_count), out(max_count);
  detail::device_buffer<double> times(2 * counts.size());
  detail::calibration_fill_kernel<T><<<1024, 256, 0, stream>>>(in.data(), max_count);
  LOWBIT_CHECK_LAUNCH();
  cudaEvent_t start, stop;
  LOWBIT_CUDA_TRY(cudaEventCreate(&start));
  LOWBIT_CUDA_TRY(cudaEventCreate(&stop));
  const std::uint32_t step = coll.step();
  std::vector<double> host(2 * counts.size());
  // Mean milliseconds of `iters` calls after one warm-up, with the crossover at `x`.
  auto time_calls = [&](std::size_t n, std::size_t x) {
    coll.set_crossover_bytes(x);
    coll.async(in.data(), out.data(), n, stream);
    LOWBIT_CUDA_TRY(cudaEventRecord(start, stream));
    for (int i = 0; i < iters; ++i) coll.async(in.data(), out.data(), n, stream);
    LOWBIT_CUDA_TRY(cudaEventRecord(stop, stream));
    comm.sync(stream);
    float ms = 0;
    LOWBIT_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
    return static_cast<double>(ms) / iters;
  };
  for (std::size_t i = 0; i < counts.size(); ++i) {
    host[2 * i] = time_calls(counts[i], 0);                                            // low-bit
    host[2 * i + 1] = time_calls(counts[i], std::numeric_limits<std::size_t>::max());  // plain
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  // The slowest rank's times decide, so that every rank draws the same line.
  LOWBIT_CUDA_TRY(cudaMemcpyAsync(times.data(), host.data(), host.size() * sizeof(double),
                                  cudaMemcpyHostToDevice, stream));
  LOWBIT_NCCL_TRY(ncclAllReduce(times.data(), times.data(), host.size(), ncclFloat64, ncclMax,
                                comm.get(), stream));
  LOWBIT_CUDA_TRY(cudaMemcpyAsync(host.data(), times.data(), host.size() * sizeof(double),
                                  cudaMemcpyDeviceToHost, stream));
  comm.sync(stream);

  std::size_t crossover = never;
  for (std::size_t i = counts.size(); i-- > 0;) {
    if (host[2 * i] >= host[2 * i + 1]) break;
    crossover = counts[i] * sizeof(T);
  }
  coll.set_step(step);
  coll.reset_feedback();
  coll.set_crossover_bytes(crossover);
  return crossover;
}

}  // namespace lowbit
