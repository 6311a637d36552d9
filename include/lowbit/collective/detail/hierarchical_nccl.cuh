// The full-precision node-local stage of the hierarchical collectives on NCCL: NCCL's own
// reduce-scatter and all-gather in T (ncclReduce / ncclBroadcast per owner, grouped, when
// the block-aligned shards are unequal), on the caller's stream, the same calls as a flat
// collective's below-crossover path. NCCL sums in its own order and precision, so the
// stage is not bitwise equal to the MPI backend's rank-order fp32 sum.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "lowbit/collective/detail/backend_nccl.cuh"
#include "lowbit/collective/detail/hierarchical_device.cuh"
#include "lowbit/collective/detail/hierarchical_stage.hpp"

namespace lowbit::detail {

template <class T>
class full_precision_stage<backend::nccl, T> {
  using impl = backend_impl<backend::nccl>;

 public:
  /// Needs no workspace: NCCL moves the values in place.
  full_precision_stage(const comm::nccl_comm& intra, std::size_t, std::size_t,
                       const collective_options&, const char*)
      : be_(intra, 0, 1) {}

  void reduce_scatter(const T* in, T* out, std::size_t count, std::size_t block, reduce_op op,
                      cudaStream_t stream) {
    be_.fallback_reduce_scatter(in, out, count, block, op, stream);
  }
  void all_gather(const T* in, T* out, std::size_t count, std::size_t block, cudaStream_t stream) {
    be_.fallback_all_gather(in, out, count, block, stream);
  }

  /// One chunk of stage 1: the ranges(p, f) of every owner p, reduced to p
  /// (nccl_backend::owner_reduces); `out` is indexed from this rank's shard's start.
  template <class Ranges>
  void reduce_scatter(const T* in, T* out, std::size_t count, std::size_t block, reduce_op op,
                      const Ranges& ranges, cudaStream_t s) {
    be_.owner_reduces(in, out, count, block, op, ranges, s);
  }
  /// One chunk of stage 3: every owner broadcasts its ranges (`in` is this rank's shard,
  /// indexed from its start) into place in `out` (nccl_backend::owner_broadcasts).
  template <class Ranges>
  void all_gather(const T* in, T* out, std::size_t count, std::size_t block, const Ranges& ranges,
                  cudaStream_t s) {
    be_.owner_broadcasts(in, out, count, block, ranges, s);
  }

 private:
  impl be_;
};

}  // namespace lowbit::detail
