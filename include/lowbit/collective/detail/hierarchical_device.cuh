// What a hierarchical call does with CUDA streams, whichever device backends carry its
// stages (NCCL, node, or the node backend inside a node and NCCL across): the events that
// let the pipelined stages overlap, and the wait that watches both communicators (also
// where stage 2 runs on the host, MPI across: hierarchical_staging.cuh stages its shard).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "lowbit/collective/backend.hpp"
#include "lowbit/collective/detail/agreement.hpp"
#include "lowbit/collective/detail/device_buffer.cuh"
#include "lowbit/collective/detail/hierarchical_stage.hpp"
#include "lowbit/collective/detail/hierarchical_staging.cuh"
#include "lowbit/comm/stream_wait.hpp"
#include "lowbit/core/error.hpp"

namespace lowbit::detail {

/// Whether B's communicator failed in a way its stream cannot report (Backend::comm_failed);
/// never for a host-ordered backend, whose calls raise their failures before they return.
template <class B, class Comm>
bool stream_failed(const Comm& comm) {
  if constexpr (stream_ordered_v<B>)
    return backend_impl<B>::comm_failed(comm);
  else
    return false;
}

/// A hierarchical call's wait on a CUDA stream. Its work runs on both communicators, so the
/// wait watches both (Backend::comm_failed: an asynchronous NCCL error, a node transfer that
/// gave up a wait): a stuck or failed node-local communicator must end the wait as a stuck
/// or failed rail does, and either one's failure poisons both (the other's kernels of the
/// call would wait on it for ever). A host-ordered rail (MPI across) has no work on the
/// stream: the wait watches the node-local communicator, and a failure poisons both still.
template <>
struct stage_sync<cudaStream_t> {
  /// Waits until `stream` is idle within cc.timeout. The failing communicator's error
  /// (lowbit::nccl_error, or lowbit::timeout_error naming the rank a transfer waited for),
  /// or lowbit::timeout_error at the deadline, both communicators poisoned either way;
  /// lowbit::invalid_argument, both poisoned, when one is already aborted or empty; a CUDA
  /// error throws lowbit::cuda_error.
  template <class IntraB, class InterB, class IntraComm, class InterComm>
  static void wait(const IntraComm& intra, const InterComm& inter, cudaStream_t stream,
                   const call_check& cc) {
    using intra_impl = backend_impl<IntraB>;
    const std::string who = cc.who;
    const char* names[2] = {"the node-local (intra) communicator",
                            "the cross-node (inter) communicator"};
    const bool valid[2] = {intra.valid(), inter.valid()};
    for (int i = 0; i < 2; ++i) {
      if (valid[i]) continue;
      poison_both<IntraB, InterB>(intra, inter, {});
      throw invalid_argument(
          __FILE__, __LINE__,
          who + ": " + names[i] + " is empty or was aborted; both are aborted now");
    }
    const auto failed = [&] {
      return intra_impl::comm_failed(intra) || stream_failed<InterB>(inter);
    };
    const comm::stream_wait w = comm::wait_stream(stream, cc.timeout, failed);
    // A node transfer that gave up may have let the stream finish: its record still tells.
    const bool intra_failed = intra_impl::comm_failed(intra);
    const bool inter_failed = stream_failed<InterB>(inter);
    if (w == comm::stream_wait::idle && !intra_failed && !inter_failed) return;
    poison_both<IntraB, InterB>(intra, inter, {});
    comm::drain_stream(stream);
    const std::string both = " (both communicators aborted)";
    if (intra_failed) intra_impl::raise_comm_failure(intra, cc, names[0] + both);
    if constexpr (stream_ordered_v<InterB>)
      if (inter_failed) backend_impl<InterB>::raise_comm_failure(inter, cc, names[1] + both);
    throw timeout_error(__FILE__, __LINE__,
                        cc.timeout_message("the work on the stream, over the node-local and the "
                                           "cross-node communicators (both aborted)"));
  }
};

/// How a pipelined hierarchical call's stages overlap on CUDA streams: stage 1 and 3 (the
/// node's communicator) on the caller's stream, stage 2 (the rail's) on a stream of its own
/// forked from it, with one event per chunk each way. Chunk k's stage 2 waits for its
/// stage 1; its stage 3 waits for its stage 2; nothing waits on the host, and the fork and
/// the join keep the call capturable in a CUDA graph.
template <>
class stage_links<cudaStream_t> {
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
