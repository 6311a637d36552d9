// lowbit::frame_transport: how the NCCL backend moves frames between GPUs, as a user asks
// for it (collective_options::transport) and as a collective reports it (transport()).
// Host-only: no CUDA or NCCL header. lowbit/collective/types.hpp re-exports it.
#pragma once

namespace lowbit {

/// How the NCCL backend moves frames between GPUs (the MPI backend ignores it). Which
/// choice is fastest depends on the transfer size and the code width
/// (transport::policy, docs/design.md "Frames live in symmetric NCCL windows"; figures in
/// docs/performance.md).
enum class frame_transport {
  /// Where every peer's memory is mapped: copy_engines for all-gathers of large slots,
  /// peer_stores below that for wide codes, nccl_symmetric for narrower ones (the
  /// thresholds are collective_options::transport_policy's). nccl_symmetric elsewhere.
  automatic,
  /// NCCL collectives on cudaMalloc workspace. The only choice that keeps construction
  /// local (no collective registration).
  nccl,
  /// NCCL collectives on workspace from ncclMemAlloc registered as a symmetric window
  /// (NCCL >= 2.27), where NCCL moves the frames with its symmetric-memory paths:
  /// faster alone, and less in the way of the codec kernels running beside them.
  nccl_symmetric,
  /// nccl_symmetric, with every all-gather a kernel that stores this rank's frames into
  /// the peers' windows over NVLink (NCCL's device API, >= 2.28): faster alone than
  /// NCCL's kernels, but it takes SMs from the codec. Used where every rank is load/store
  /// accessible; nccl_symmetric elsewhere (PCIe without P2P, sockets).
  peer_stores,
  /// nccl_symmetric, with every all-gather on a zero-CTA split of the communicator
  /// (NCCL >= 2.28): within a node NCCL runs it on the GPUs' copy engines, the fastest
  /// large transfer, and leaves every SM to the codec kernels. two_phase's all-to-alls
  /// stay NCCL kernels; nccl_symmetric where NCCL has no CTA policies.
  copy_engines,
};

/// Every frame_transport, for parsing and for tests.
inline constexpr frame_transport all_frame_transports[] = {
    frame_transport::automatic, frame_transport::nccl, frame_transport::nccl_symmetric,
    frame_transport::peer_stores, frame_transport::copy_engines};

/// Name of a frame_transport, for messages.
constexpr const char* to_string(frame_transport t) {
  switch (t) {
    case frame_transport::automatic:
      return "automatic";
    case frame_transport::nccl:
      return "nccl";
    case frame_transport::nccl_symmetric:
      return "nccl_symmetric";
    case frame_transport::peer_stores:
      return "peer_stores";
    case frame_transport::copy_engines:
      return "copy_engines";
  }
  return "?";
}

}  // namespace lowbit
