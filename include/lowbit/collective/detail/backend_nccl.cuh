// The NCCL backend: device_steps (device buffers, the CUDA codec kernels, two lanes) and a
// transport::frame_mover moving the frames over an NCCL communicator (which transport, and
// the transfers themselves: lowbit/transport/); below the crossover, NCCL's own collectives.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <string>
#include <vector>

#include "lowbit/collective/backend.hpp"
#include "lowbit/collective/detail/agreement.hpp"
#include "lowbit/collective/detail/device_buffer.cuh"
#include "lowbit/collective/detail/device_steps.cuh"
#include "lowbit/collective/detail/engine.hpp"
#include "lowbit/comm/nccl_comm.hpp"
#include "lowbit/transport/nccl/frame_mover.cuh"
#include "lowbit/transport/nccl/window_buffer.cuh"

namespace lowbit::detail {

/// backend_impl<backend::nccl>'s members (collective/backend.hpp lists them).
class nccl_backend : public device_steps {
 public:
  using comm_type = comm::nccl_comm;
  /// The frames the transport moves: symmetric NCCL windows when asked.
  using transfer_buffer = lowbit::transport::window_buffer;
  /// Below the crossover a call runs NCCL's own collective (fallback_* below).
  static constexpr bool has_fallback = true;

  nccl_backend(const comm_type& comm, int events, int streams)
      : device_steps(events, streams), comm_(&comm), mover_(comm) {}

  static void check_comm(const comm_type& comm, const char* who) { comm.check(who); }
  /// A failure the stream cannot report: an asynchronous NCCL error.
  static bool comm_failed(const comm_type& comm) {
    const ncclResult_t e = comm.async_error();
    return e != ncclSuccess && e != ncclInProgress;
  }
  /// Throws what comm_failed() saw: lowbit::nccl_error naming `where`.
  [[noreturn]] static void raise_comm_failure(const comm_type& comm, const call_check& cc,
                                              const std::string& where) {
    const ncclResult_t e = comm.async_error();
    throw nccl_error(__FILE__, __LINE__, static_cast<int>(e),
                     std::string(cc.who) + ": asynchronous NCCL error on " + where + ": " +
                         ncclGetErrorString(e));
  }
  /// Aborts the communicator (its kernels end; it refuses calls from then on).
  static void poison(const comm_type& comm, const std::string& /*why*/) noexcept { comm.abort(); }
  /// Chooses how frames move, before any make_transfer_buffer, for codes of at most
  /// `widest_bits` bits (transport::frame_mover). Collective over the communicator
  /// unless `t` is frame_transport::nccl.
  void set_transport(frame_transport t, const lowbit::transport::policy& p, int widest_bits) {
    mover_ = lowbit::transport::frame_mover(*comm_, t, widest_bits, p);
  }
  /// The transport of the largest all-gathers of the widest codes (automatic resolved).
  frame_transport transport() const noexcept { return mover_.transport(); }
  /// Collective over the communicator with a symmetric transport (window registration).
  transfer_buffer make_transfer_buffer(std::size_t bytes) const {
    return mover_.make_buffer(bytes);
  }
  static void check_sizes(std::size_t, std::size_t, std::size_t) {}
  void check_alive(const char* who) const { comm_->check(who); }

  /// Every rank's `bytes` at `mine` (host memory), rank by rank, in host memory: checked
  /// mode's fingerprints. Synchronises the host with the caller's stream (caller_ of the
  /// call being checked), within cc.timeout; on expiry the communicator is aborted.
  const std::byte* allgather_small(const void* mine, std::size_t bytes, call_check& cc) {
    const std::size_t total = bytes * static_cast<std::size_t>(comm_->size());
    if (small_dev_.size() < total) {  // checked mode only: allocated on its first call
      small_dev_ = device_buffer<std::byte>(total);
      small_host_.assign(total, std::byte{0});
    }
    std::byte* mine_dev = small_dev_.data() + static_cast<std::size_t>(comm_->rank()) * bytes;
    LOWBIT_CUDA_TRY(cudaMemcpyAsync(mine_dev, mine, bytes, cudaMemcpyHostToDevice, check_stream_));
    LOWBIT_NCCL_TRY(
        ncclAllGather(mine_dev, small_dev_.data(), bytes, ncclUint8, comm_->get(), check_stream_));
    LOWBIT_CUDA_TRY(cudaMemcpyAsync(small_host_.data(), small_dev_.data(), total,
                                    cudaMemcpyDeviceToHost, check_stream_));
    sync(check_stream_, cc);
    return small_host_.data();
  }
  /// The stream checked mode's exchange runs on (the caller's, set by the engine).
  void set_check_stream(cudaStream_t s) { check_stream_ = s; }

  /// Waits until `stream` is idle within cc.timeout, polling NCCL's asynchronous error:
  /// lowbit::timeout_error (communicator aborted) on expiry, lowbit::nccl_error on an NCCL
  /// error.
  void sync(cudaStream_t stream, const call_check& cc) {
    try {
      comm_->sync(stream, cc.timeout);
    } catch (const timeout_error&) {
      throw timeout_error(__FILE__, __LINE__, cc.timeout_message("the work on the stream"));
    }
  }

  /// Two-sided (ncclSend/ncclRecv): the peers' offsets are theirs to know.
  void alltoallv(lane l, const transfer_buffer& send, const std::size_t* send_bytes,
                 const std::size_t* send_off, transfer_buffer& recv, const std::size_t* recv_bytes,
                 const std::size_t* recv_off, const std::size_t* /*peer_recv_off*/, call_check&) {
    mover_.alltoallv(send.data(), send_bytes, send_off, recv.data(), recv_bytes, recv_off,
                     stream(l));
  }

  /// In place: P slots of slot_bytes at `offset` of buf; slot `rank` is this rank's;
  /// the frames hold `bits`-bit codes.
  void allgather(lane l, const transfer_buffer& buf, std::size_t offset, std::size_t slot_bytes,
                 int bits, call_check&) {
    mover_.allgather(buf, offset, slot_bytes, bits, overlap_, stream(l));
  }

  // ---- NCCL's own collectives, for calls below the crossover (on the caller's stream) ---
  static ncclRedOp_t nccl_op(reduce_op op) { return op == reduce_op::avg ? ncclAvg : ncclSum; }

  template <class T>
  void fallback_all_reduce(const T* in, T* out, std::size_t count, reduce_op op, cudaStream_t s) {
    LOWBIT_NCCL_TRY(
        ncclAllReduce(in, out, count, comm::nccl_data_type<T>(), nccl_op(op), comm_->get(), s));
  }
  /// lowbit's block-aligned shards: ncclReduceScatter when they are equal, else one
  /// ncclReduce per owner, grouped (slower than NCCL's own; docs/design.md "Crossover").
  template <class T>
  void fallback_reduce_scatter(const T* in, T* out, std::size_t count, std::size_t block,
                               reduce_op op, cudaStream_t s) {
    if (const std::size_t n = schedule::equal_shard(count, block, comm_->size()); n > 0) {
      LOWBIT_NCCL_TRY(
          ncclReduceScatter(in, out, n, comm::nccl_data_type<T>(), nccl_op(op), comm_->get(), s));
      return;
    }
    owner_reduces(in, out, count, block, op, schedule::whole_shards{count, block, comm_->size()},
                  s);
  }
  /// in = my shard: ncclAllGather when the shards are equal, else each owner broadcasts
  /// its shard into place, grouped (slower than NCCL's own; docs/design.md "Crossover").
  template <class T>
  void fallback_all_gather(const T* in, T* out, std::size_t count, std::size_t block,
                           cudaStream_t s) {
    if (const std::size_t n = schedule::equal_shard(count, block, comm_->size()); n > 0) {
      LOWBIT_NCCL_TRY(ncclAllGather(in, out, n, comm::nccl_data_type<T>(), comm_->get(), s));
      return;
    }
    owner_broadcasts(in, out, count, block, schedule::whole_shards{count, block, comm_->size()}, s);
  }

  /// For every owner p and range r of ranges(p, f) (indices from the start of p's
  /// block-aligned shard), an ncclReduce of those values to p, grouped; `out` is indexed
  /// from this rank's shard's start. Every rank issues the same calls in the same order. A
  /// non-root rank's receive buffer is not written, but NCCL may check it: it gets `out`
  /// itself, as p's offsets can lie past the end of this rank's (smaller) shard.
  template <class T, class Ranges>
  void owner_reduces(const T* in, T* out, std::size_t count, std::size_t block, reduce_op op,
                     const Ranges& ranges, cudaStream_t s) {
    const int me = comm_->rank(), P = comm_->size();
    LOWBIT_NCCL_TRY(ncclGroupStart());
    for (int p = 0; p < P; ++p) {
      const T* shard = in + schedule::shard(count, block, P, p).begin;
      ranges(p, [&](schedule::range r) {
        LOWBIT_NCCL_TRY(ncclReduce(shard + r.begin, p == me ? out + r.begin : out, r.count,
                                   comm::nccl_data_type<T>(), nccl_op(op), p, comm_->get(), s));
      });
    }
    LOWBIT_NCCL_TRY(ncclGroupEnd());
  }
  /// Every owner broadcasts its ranges (`in` is this rank's shard, indexed from its start)
  /// into place in `out`, grouped.
  template <class T, class Ranges>
  void owner_broadcasts(const T* in, T* out, std::size_t count, std::size_t block,
                        const Ranges& ranges, cudaStream_t s) {
    const int me = comm_->rank(), P = comm_->size();
    LOWBIT_NCCL_TRY(ncclGroupStart());
    for (int p = 0; p < P; ++p) {
      T* shard = out + schedule::shard(count, block, P, p).begin;
      ranges(p, [&](schedule::range r) {
        LOWBIT_NCCL_TRY(ncclBroadcast(p == me ? in + r.begin : shard + r.begin, shard + r.begin,
                                      r.count, comm::nccl_data_type<T>(), p, comm_->get(), s));
      });
    }
    LOWBIT_NCCL_TRY(ncclGroupEnd());
  }

 private:
  const comm_type* comm_;
  lowbit::transport::frame_mover mover_;  ///< picks the transport and moves the frames
  cudaStream_t check_stream_ = nullptr;
  device_buffer<std::byte> small_dev_;  ///< checked mode's fingerprints, on the device
  std::vector<std::byte> small_host_;   ///< ... and on the host
};

}  // namespace lowbit::detail

namespace lowbit {
template <>
struct backend_impl<backend::nccl> : detail::nccl_backend {
  using detail::nccl_backend::nccl_backend;
};
static_assert(check_backend<backend_impl<backend::nccl>>());
}  // namespace lowbit
