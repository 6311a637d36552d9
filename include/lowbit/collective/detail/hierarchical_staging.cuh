// How a hierarchical call whose node-local stages run on a CUDA stream hands its rail shard
// to a cross-node stage that runs on the host (the MPI backend: staged_rail_v): pinned
// host buffers, allocated once at construction, and copies on the call's stream.
//
// What crosses PCIe is the shard's values, once each way: stage 2 is the host backend's
// own flat collective, whose codec (host/codec_executor.hpp) reads values and writes frames
// in host memory only. Staging the encoded frames alone would move fewer bytes at low
// widths (a 4-bit frame is about a quarter of a bf16 shard's bytes), but needs the frames
// encoded, summed and decoded by the device kernels between MPI's transfers: a backend of
// its own (device codec, MPI moving pinned frames, a host wait before each transfer),
// which this is not. Staging the values keeps stage 2 the very code of mpi::hierarchical_*,
// so the pairing computes its bits by construction (the node-local stages compute the host
// stages' bits: hierarchical_node.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "lowbit/collective/detail/device_buffer.cuh"
#include "lowbit/collective/detail/hierarchical_stage.hpp"
#include "lowbit/core/error.hpp"

namespace lowbit::detail {

template <class T>
class rail_staging<cudaStream_t, T> {
 public:
  /// Stage 2's input and, unless `in_place`, output buffer of `values` each.
  rail_staging(std::size_t values, bool in_place)
      : in_(values), out_(in_place ? 0 : values), in_place_(in_place) {}

  /// Enqueues the copy of from[0, n) (device memory) into the input buffer on `stream` and
  /// returns the buffer: it holds the values once the stream has been waited for.
  T* to_host(const T* from, std::size_t n, cudaStream_t stream) {
    LOWBIT_CUDA_TRY(
        cudaMemcpyAsync(in_.data(), from, n * sizeof(T), cudaMemcpyDeviceToHost, stream));
    return in_.data();
  }
  /// Where stage 2 writes its result.
  T* result() noexcept { return in_place_ ? in_.data() : out_.data(); }
  /// Enqueues the copy of result()[0, n) to `to` (device memory) on `stream`; result() must
  /// not change until the stream has passed it (a hierarchical call waits for its stream
  /// before it returns).
  void to_device(T* to, std::size_t n, cudaStream_t stream) {
    LOWBIT_CUDA_TRY(cudaMemcpyAsync(to, result(), n * sizeof(T), cudaMemcpyHostToDevice, stream));
  }

 private:
  pinned_buffer<T> in_, out_;
  bool in_place_;
};

}  // namespace lowbit::detail
