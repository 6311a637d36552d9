// The node backend: device_steps (device buffers, the CUDA codec kernels, two lanes) and a
// transport::ipc_mover storing the frames into the peers' windows over CUDA IPC, for the
// ranks of one node, with no NCCL (lowbit/comm/node_comm.hpp). Several ranks may share
// one GPU. No crossover: every call runs the codec.
//
// Deadlines: the transfer kernels give up a wait at the collective's timeout (or when the
// communicator is aborted) and leave a record; sync() raises it as lowbit::timeout_error,
// and aborts the communicator when its own deadline passes first, which ends every wait.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include "lowbit/collective/backend.hpp"
#include "lowbit/collective/detail/agreement.hpp"
#include "lowbit/collective/detail/device_steps.cuh"
#include "lowbit/collective/detail/engine.hpp"
#include "lowbit/comm/node_comm.hpp"
#include "lowbit/comm/stream_wait.hpp"
#include "lowbit/transport/ipc/ipc_mover.cuh"
#include "lowbit/transport/ipc/ipc_window.hpp"

namespace lowbit::detail {

/// backend_impl<backend::node>'s members (collective/backend.hpp lists them).
class node_backend : public device_steps {
 public:
  using comm_type = comm::node_comm;
  /// Every rank's windows are mapped into every other's.
  using transfer_buffer = lowbit::transport::ipc_window;
  /// No fallback collective: the codec always runs.
  static constexpr bool has_fallback = false;
  /// The largest fingerprint allgather_small moves (checked mode's are 32 bytes).
  static constexpr std::size_t small_bytes = 256;

  /// Collective over the communicator: the flag window and checked mode's window.
  node_backend(const comm_type& comm, int events, int streams)
      : device_steps(events, streams),
        comm_(&comm),
        mover_(comm, who),
        small_(comm, small_bytes * static_cast<std::size_t>(comm.size()), who) {}

  static void check_comm(const comm_type& comm, const char* who) { comm.check(who); }
  /// A failure the stream cannot report: a transfer on the communicator gave up a wait.
  static bool comm_failed(const comm_type& comm) { return !comm.missed().empty(); }
  /// Throws what comm_failed() saw, as a timeout of the call `cc` on `where`.
  [[noreturn]] static void raise_comm_failure(const comm_type& comm, const call_check& cc,
                                              const std::string& where) {
    throw timeout_error(__FILE__, __LINE__, cc.timeout_message(comm.missed() + " on " + where));
  }
  /// Ends every wait on the communicator, which refuses calls from then on.
  static void poison(const comm_type& comm, const std::string& /*why*/) noexcept { comm.abort(); }
  /// Frames always move by peer stores: the requested transport does not apply.
  void set_transport(frame_transport, const lowbit::transport::policy&, int) {}
  static frame_transport transport() noexcept { return frame_transport::peer_stores; }
  /// Collective over the communicator (every rank maps every other's window).
  transfer_buffer make_transfer_buffer(std::size_t bytes) const {
    return mover_.make_buffer(bytes, who);
  }
  static void check_sizes(std::size_t, std::size_t, std::size_t) {}
  void check_alive(const char* caller) const { comm_->check(caller); }

  /// Every rank's `bytes` at `mine`, rank by rank, in host memory (checked mode); waits for
  /// the caller's stream within cc.timeout.
  const std::byte* allgather_small(const void* mine, std::size_t bytes, call_check& cc) {
    LOWBIT_EXPECTS(bytes <= small_bytes, "lowbit (node backend): a fingerprint of " +
                                             std::to_string(bytes) + " bytes exceeds " +
                                             std::to_string(small_bytes));
    const std::size_t P = static_cast<std::size_t>(comm_->size());
    std::byte* slot = small_.data() + static_cast<std::size_t>(comm_->rank()) * small_bytes;
    LOWBIT_CUDA_TRY(cudaMemcpyAsync(slot, mine, bytes, cudaMemcpyHostToDevice, check_stream_));
    mover_.allgather(small_, 0, small_bytes, cc.timeout, check_stream_);
    small_host_.resize(P * bytes);  // every slot's first `bytes`, packed
    LOWBIT_CUDA_TRY(cudaMemcpy2DAsync(small_host_.data(), bytes, small_.data(), small_bytes, bytes,
                                      P, cudaMemcpyDeviceToHost, check_stream_));
    sync(check_stream_, cc);
    return small_host_.data();
  }
  void set_check_stream(cudaStream_t s) { check_stream_ = s; }

  /// Waits until `stream` is idle within cc.timeout: lowbit::timeout_error (communicator
  /// aborted) when a transfer gave up a wait or the deadline passes.
  void sync(cudaStream_t stream, const call_check& cc) {
    comm_->check("lowbit (node backend) sync");
    const comm::stream_wait w =
        comm::wait_stream(stream, cc.timeout, [&] { return comm_failed(*comm_); });
    // A transfer that gave up may have let its stream finish: its record still tells.
    const std::string missed = comm_->missed();
    if (w == comm::stream_wait::idle && missed.empty()) return;
    comm_->abort();  // ends every wait still running on the GPU
    comm::drain_stream(stream);
    throw timeout_error(__FILE__, __LINE__,
                        cc.timeout_message(missed.empty() ? "the work on the stream" : missed));
  }

  void alltoallv(lane l, const transfer_buffer& send, const std::size_t* send_bytes,
                 const std::size_t* send_off, transfer_buffer& recv, const std::size_t* recv_bytes,
                 const std::size_t* recv_off, const std::size_t* peer_recv_off, call_check& cc) {
    mover_.alltoallv(send, send_bytes, send_off, recv, recv_bytes, recv_off, peer_recv_off,
                     cc.timeout, stream(l));
  }

  /// In place: P slots of slot_bytes at `offset` of buf; slot `rank` is this rank's.
  void allgather(lane l, const transfer_buffer& buf, std::size_t offset, std::size_t slot_bytes,
                 int /*bits*/, call_check& cc) {
    mover_.allgather(buf, offset, slot_bytes, cc.timeout, stream(l));
  }

 private:
  static constexpr const char* who = "lowbit (node backend)";

  const comm_type* comm_;
  lowbit::transport::ipc_mover mover_;
  transfer_buffer small_;  ///< checked mode: small_bytes per rank
  cudaStream_t check_stream_ = nullptr;
  std::vector<std::byte> small_host_;
};

}  // namespace lowbit::detail

namespace lowbit {
template <>
struct backend_impl<backend::node> : detail::node_backend {
  using detail::node_backend::node_backend;
};
static_assert(check_backend<backend_impl<backend::node>>());
}  // namespace lowbit
