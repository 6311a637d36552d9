// Waiting for a CUDA stream within a deadline while watching for a failure the stream
// itself cannot report (an NCCL communicator's asynchronous error, a node transfer that
// gave up a wait): the one loop behind every device backend's sync(), instead of a hang.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <thread>

#include "lowbit/core/error.hpp"

namespace lowbit::comm {

/// How a wait_stream ended.
enum class stream_wait { idle, failed, timed_out };

/// Waits until `stream` is idle, polling cudaStreamQuery and, while it is busy, `failed()`
/// (true ends the wait) and the deadline (`timeout`; zero: none). Aborts nothing: the
/// caller decides what a failure aborts. A CUDA error throws lowbit::cuda_error.
template <class Failed>
stream_wait wait_stream(cudaStream_t stream, std::chrono::milliseconds timeout, Failed&& failed) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t s = cudaStreamQuery(stream);
    if (s == cudaSuccess) return stream_wait::idle;
    if (s != cudaErrorNotReady) LOWBIT_CUDA_TRY(s);
    if (failed()) return stream_wait::failed;
    if (timeout.count() > 0 && std::chrono::steady_clock::now() - start > timeout)
      return stream_wait::timed_out;
    std::this_thread::yield();
  }
}

/// After a communicator's abort its kernels end their waits within microseconds: waits up to
/// `limit` for `stream` to drain, then leaves it (the communicator is unusable anyway) and
/// clears the sticky "not ready" state.
inline void drain_stream(cudaStream_t stream,
                         std::chrono::milliseconds limit = std::chrono::milliseconds(1000)) {
  const auto start = std::chrono::steady_clock::now();
  while (cudaStreamQuery(stream) == cudaErrorNotReady &&
         std::chrono::steady_clock::now() - start < limit)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  (void)cudaGetLastError();
}

}  // namespace lowbit::comm
