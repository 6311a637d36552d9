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

}  // namespace lowbit::comm
