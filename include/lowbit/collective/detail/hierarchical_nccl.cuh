// The full-precision node-local stage of the hierarchical collectives on NCCL: NCCL's own
// reduce-scatter and all-gather in T (ncclReduce / ncclBroadcast per owner, grouped, when
// the block-aligned shards are unequal), on the caller's stream, the same calls as a flat
// collective's below-crossover path. NCCL sums in its own order and precision, so the
// stage is not bitwise equal to the MPI backend's rank-order fp32 sum.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include "lowbit/collective/detail/backend_nccl.cuh"
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

/// A hierarchical call's two NCCL communicators. Its work on the caller's stream runs on
/// both, so a wait watches both: a stuck or failed node-local communicator must end the
/// wait as a stuck or failed rail does, and either one's failure aborts both (the other's
/// kernels of the call would wait on it for ever).
template <>
struct both_comms<backend::nccl> {
  static void poison(const comm::nccl_comm& intra, const comm::nccl_comm& inter,
                     const std::string& /*why*/) noexcept {
    intra.abort();
    inter.abort();
  }

  /// Waits until `stream` is idle within cc.timeout, polling cudaStreamQuery and, while it
  /// is busy, both communicators' asynchronous errors (nccl_comm::sync's loop, over two):
  /// lowbit::nccl_error on an NCCL error, lowbit::timeout_error on expiry, both
  /// communicators aborted either way; lowbit::invalid_argument, both aborted, when one is
  /// already aborted or empty; a CUDA error throws lowbit::cuda_error.
  static void sync(const comm::nccl_comm& intra, const comm::nccl_comm& inter, cudaStream_t stream,
                   const call_check& cc) {
    const comm::nccl_comm* comms[2] = {&intra, &inter};
    const char* names[2] = {"node-local (intra)", "cross-node (inter)"};
    const std::string who = cc.who;
    for (int i = 0; i < 2; ++i) {
      if (comms[i]->valid()) continue;
      poison(intra, inter, {});
      throw invalid_argument(__FILE__, __LINE__,
                             who + ": the " + names[i] +
                                 " NCCL communicator is empty or was aborted; both are "
                                 "aborted now");
    }
    comm::nccl_failure f;
    const comm::stream_wait w = comm::wait_stream(stream, cc.timeout, [&] { return f(comms, 2); });
    if (w == comm::stream_wait::idle) return;
    poison(intra, inter, {});
    if (w == comm::stream_wait::failed)
      throw nccl_error(
          __FILE__, __LINE__, static_cast<int>(f.error),
          who + ": asynchronous NCCL error on the " + names[f.which] +
              " communicator (both communicators aborted): " + ncclGetErrorString(f.error));
    throw timeout_error(__FILE__, __LINE__,
                        cc.timeout_message("the work on the stream, over the node-local and the "
                                           "cross-node communicators (both aborted)"));
  }
};

/// How a pipelined hierarchical call's stages overlap on NCCL: stage 1 and 3 (the node's
/// communicator) on the caller's stream, stage 2 (the rail's) on a stream of its own
/// forked from it, with one event per chunk each way. Chunk k's stage 2 waits for its
/// stage 1; its stage 3 waits for its stage 2; nothing waits on the host, and the fork
/// and the join keep the call capturable in a CUDA graph.
template <>
class stage_links<backend::nccl> {
 public:
  explicit stage_links(int max_chunks) : side_(unique_stream::create()) {
    events_.reserve(2 * static_cast<std::size_t>(max_chunks) + 2);
    for (int i = 0; i < 2 * max_chunks + 2; ++i) events_.push_back(unique_event::create());
    K_ = max_chunks;
  }
  /// Forks stage 2's stream from the caller's (when `overlap`) and returns it.
  cudaStream_t begin(cudaStream_t caller, bool overlap) {
    caller_ = caller;
    on_ = overlap;
    if (!on_) return caller;
    LOWBIT_CUDA_TRY(cudaEventRecord(ev(2 * K_), caller_));
    LOWBIT_CUDA_TRY(cudaStreamWaitEvent(side_.get(), ev(2 * K_), 0));
    return side_.get();
  }
  /// After stage 1 of chunk k, on the caller's stream.
  void staged(int k) {
    if (on_) LOWBIT_CUDA_TRY(cudaEventRecord(ev(k), caller_));
  }
  /// Stage 2's Links (engine.hpp): before chunk k's input is read, after its output.
  void input_ready(int k) const {
    if (on_) LOWBIT_CUDA_TRY(cudaStreamWaitEvent(side_.get(), ev(k), 0));
  }
  void output_ready(int k) const {
    if (on_) LOWBIT_CUDA_TRY(cudaEventRecord(ev(K_ + k), side_.get()));
  }
  /// Before stage 3 of chunk k, on the caller's stream.
  void before_gather(int k) {
    if (on_) LOWBIT_CUDA_TRY(cudaStreamWaitEvent(caller_, ev(K_ + k), 0));
  }
  /// Joins stage 2's stream back into the caller's.
  void end() {
    if (!on_) return;
    LOWBIT_CUDA_TRY(cudaEventRecord(ev(2 * K_ + 1), side_.get()));
    LOWBIT_CUDA_TRY(cudaStreamWaitEvent(caller_, ev(2 * K_ + 1), 0));
  }

 private:
  cudaEvent_t ev(int i) const { return events_[static_cast<std::size_t>(i)].get(); }

  unique_stream side_;
  std::vector<unique_event> events_;
  int K_ = 1;
  cudaStream_t caller_ = nullptr;
  bool on_ = false;
};

}  // namespace lowbit::detail
