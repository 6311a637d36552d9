// transport::frame_mover: what moves a collective's frames on the NCCL backend. It picks
// the transport once at construction (transport::resolve over what the communicator
// offers) and for each all-gather (transport::choose), owns the peer stores, holds the
// communicator's copy engines, makes the workspace (window_buffer), and issues the
// all-to-alls and all-gathers of frames on the stream it is given. The backend keeps the
// streams, the events and the codec.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <sstream>

#include "lowbit/comm/nccl_comm.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/nccl_try.hpp"
#include "lowbit/transport/nccl/copy_engines.cuh"
#include "lowbit/transport/frame_transport.hpp"
#include "lowbit/transport/nccl/peer_stores.cuh"
#include "lowbit/transport/nccl/policy.hpp"
#include "lowbit/transport/nccl/window_buffer.cuh"

namespace lowbit::transport {

/// Moves frames over one nccl_comm, which must outlive it. Move-only.
class frame_mover {
 public:
  frame_mover() = default;

  /// Frames that NCCL moves on cudaMalloc workspace (frame_transport::nccl): local.
  explicit frame_mover(const comm::nccl_comm& comm) : comm_(&comm) {}

  /// The transport a collective asking for `requested`, with codes of at most
  /// `widest_bits` bits, uses on `comm` under `p`. Collective over the communicator unless
  /// `requested` is frame_transport::nccl or there is one rank: the peer stores' device
  /// communicator, and, the first time a collective on the communicator asks, its
  /// copy-engine split and peer probe. Throws lowbit::invalid_argument for a policy out of
  /// range (transport::valid).
  frame_mover(const comm::nccl_comm& comm, frame_transport requested, int widest_bits,
              const policy& p)
      : comm_(&comm) {
    if (!valid(p)) {
      std::ostringstream os;
      os << "collective_options::transport_policy is out of range (peer_store_ctas must be "
            "in 1..1024): "
         << p;
      throw invalid_argument(__FILE__, __LINE__, os.str());
    }
    support s;
    s.symmetric_windows = LOWBIT_HAS_NCCL_WINDOWS && comm.size() > 1;
    if (s.symmetric_windows && requested != frame_transport::nccl) {
      // A device communicator only where some all-gather would store to the peers.
      const bool stores = wants_peer_stores(p, requested, widest_bits);
      if (stores) stores_ = peer_stores(comm.get(), p.peer_store_ctas, &comm);
      s.peer_stores = stores_.enabled();
      // automatic takes the copy engines only where the peers' memory is mapped (NVLink or
      // PCIe P2P); without it NCCL has no copy-engine path. The communicator answers that
      // once, from whether a device communicator could be made (stores_ when this object
      // made one), and the split is the communicator's too: the next collectives on it pay
      // for neither.
      if (requested == frame_transport::automatic)
        s.peers_mapped = comm.peers_mapped([&](ncclComm_t c) {
          return stores ? stores_.enabled() : peer_stores(c, p.peer_store_ctas).enabled();
        });
      if (wants_copy_engines(requested, s.peers_mapped)) engines_ = copy_engines(comm);
      s.cta_policies = engines_.enabled();
    }
    setup_ = resolve(p, requested, s, widest_bits);
  }

  /// What construction resolved.
  const lowbit::transport::setup& setup() const noexcept { return setup_; }
  /// The transport of the largest all-gathers of the widest codes (never automatic).
  frame_transport transport() const noexcept { return reported(setup_); }

  /// `bytes` of workspace for frames: symmetric windows (registered with the copy
  /// engines' split too when there is one) where the set-up says so. Collective when
  /// symmetric.
  window_buffer make_buffer(std::size_t bytes) const {
    return window_buffer(comm_->get(), bytes, setup_.symmetric, engines_.get(), comm_);
  }

  /// Sends each peer p its send_bytes[p] at send + send_off[p] and receives each peer's
  /// recv_bytes[p] into recv + recv_off[p] (zero-byte entries are no message): NCCL kernels
  /// whatever the transport.
  void alltoallv(const std::byte* send, const std::size_t* send_bytes, const std::size_t* send_off,
                 std::byte* recv, const std::size_t* recv_bytes, const std::size_t* recv_off,
                 cudaStream_t s) const {
    const int P = comm_->size();
    ncclComm_t c = comm_->get();
    LOWBIT_NCCL_TRY(ncclGroupStart());
    for (int p = 0; p < P; ++p) {
      if (send_bytes[p] > 0)
        LOWBIT_NCCL_TRY(ncclSend(send + send_off[p], send_bytes[p], ncclUint8, p, c, s));
      if (recv_bytes[p] > 0)
        LOWBIT_NCCL_TRY(ncclRecv(recv + recv_off[p], recv_bytes[p], ncclUint8, p, c, s));
    }
    LOWBIT_NCCL_TRY(ncclGroupEnd());
  }

  /// In place: P slots of slot_bytes at `offset` of buf; slot `rank` is this rank's; the
  /// frames hold `bits`-bit codes; `overlapped`: the call has several chunks, so the
  /// transfer runs beside the codec.
  void allgather(const window_buffer& buf, std::size_t offset, std::size_t slot_bytes, int bits,
                 bool overlapped, cudaStream_t s) const {
    if (comm_->size() == 1) return;
    const frame_transport how =
        buf.symmetric() ? choose(setup_, bits, slot_bytes, overlapped) : frame_transport::nccl;
    if (how == frame_transport::peer_stores) return stores_.allgather(buf, offset, slot_bytes, s);
    if (how == frame_transport::copy_engines) return engines_.allgather(buf, offset, slot_bytes, s);
    std::byte* base = buf.data() + offset;
    LOWBIT_NCCL_TRY(ncclAllGather(base + static_cast<std::size_t>(comm_->rank()) * slot_bytes, base,
                                  slot_bytes, ncclUint8, comm_->get(), s));
  }

 private:
  const comm::nccl_comm* comm_ = nullptr;
  lowbit::transport::setup setup_;
  peer_stores stores_;    ///< enabled: all-gathers of wide enough codes may store to peers
  copy_engines engines_;  ///< enabled: large all-gathers may run on the copy engines
};

}  // namespace lowbit::transport
