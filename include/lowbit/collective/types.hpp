// Vocabulary shared by the collectives: reduce ops, options, element-type tags and the
// backend tags.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "lowbit/core/numeric.hpp"

namespace lowbit {

/// How the ranks' contributions are combined.
enum class reduce_op {
  sum,  ///< the sum over ranks
  avg,  ///< the sum over ranks times 1/P (applied when decoding, in fp32)
};

/// Run-time element type, for the type-checked `void*` entry points.
enum class data_type { float32, float16, bfloat16 };

/// The data_type of T.
template <class T>
constexpr data_type data_type_of() {
  if constexpr (std::is_same_v<T, float>) {
    return data_type::float32;
#if LOWBIT_HAS_CUDA_HALF
  } else if constexpr (std::is_same_v<T, __half>) {
    return data_type::float16;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return data_type::bfloat16;
#endif
  } else {
    static_assert(dependent_false<T>,
                  "lowbit: the element type must be float, __half or __nv_bfloat16");
    return data_type::float32;
  }
}

/// Name of a data_type, for messages.
inline const char* to_string(data_type t) {
  switch (t) {
    case data_type::float32:
      return "float32";
    case data_type::float16:
      return "float16";
    case data_type::bfloat16:
      return "bfloat16";
  }
  return "?";
}

/// How all_reduce moves the frames.
enum class all_reduce_algorithm {
  /// one_shot on 2 ranks (the same bytes on the wire, one quantization, one transfer),
  /// two_phase on more.
  automatic,
  /// Reduce-scatter then all-gather of frames: every value is quantized twice (the sum is
  /// re-encoded by its owner); each rank sends 2(P-1)/P frames of the tensor.
  two_phase,
  /// All-gather of every rank's whole frame, then every rank decodes and sums all P frames
  /// (the same order on every rank, so the same bits): one quantization and one
  /// transfer, but each rank sends (P-1) frames of the tensor, P/2 times two_phase's,
  /// and holds P of them in its workspace.
  one_shot,
};

/// How the NCCL backend moves frames between GPUs (the MPI backend ignores it).
/// Measured on 2x H200 over NVLink (docs/performance.md): copy_engines is the fastest for
/// large transfers (bf16 4-bit all_reduce at 1 GiB 2.71x NCCL, against 2.57x for
/// nccl_symmetric), NCCL's kernels on symmetric windows for small ones.
enum class frame_transport {
  /// Where every peer's memory is mapped: copy_engines for all-gathers of large slots (10
  /// MiB per rank in a pipelined call at under 8 bits, else 32 MiB), below that
  /// peer_stores for codes of 8 bits or more and nccl_symmetric for narrower ones.
  /// nccl_symmetric elsewhere.
  automatic,
  /// NCCL collectives on cudaMalloc workspace. The only choice that keeps construction
  /// local (no collective registration).
  nccl,
  /// NCCL collectives on workspace from ncclMemAlloc registered as a symmetric window
  /// (NCCL >= 2.27), where NCCL moves the frames with its symmetric-memory paths:
  /// faster alone, and less in the way of the codec kernels running beside them.
  nccl_symmetric,
  /// nccl_symmetric, with every all-gather a kernel that stores this rank's frames into
  /// the peers' windows over NVLink (NCCL's device API, >= 2.28): faster alone (359
  /// against 321 GB/s per rank at 256 MiB) but it takes SMs from the codec. Used where
  /// every rank is load/store accessible; nccl_symmetric elsewhere (PCIe without P2P,
  /// sockets).
  peer_stores,
  /// nccl_symmetric, with every all-gather on a zero-CTA split of the communicator
  /// (NCCL >= 2.28): within a node NCCL runs it on the GPUs' copy engines (382 against
  /// 323 GB/s per rank at 256 MiB) and leaves every SM to the codec kernels. two_phase's
  /// all-to-alls stay NCCL kernels; nccl_symmetric where NCCL has no CTA policies.
  copy_engines,
};

/// Every frame_transport, for parsing and for tests.
inline constexpr frame_transport all_frame_transports[] = {
    frame_transport::automatic, frame_transport::nccl, frame_transport::nccl_symmetric,
    frame_transport::peer_stores, frame_transport::copy_engines};

/// Name of a frame_transport, for messages.
inline const char* to_string(frame_transport t) {
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

/// Name of an all_reduce_algorithm, for messages.
inline const char* to_string(all_reduce_algorithm a) {
  switch (a) {
    case all_reduce_algorithm::automatic:
      return "automatic";
    case all_reduce_algorithm::two_phase:
      return "two_phase";
    case all_reduce_algorithm::one_shot:
      return "one_shot";
  }
  return "?";
}

/// Construction-time options of a collective object.
struct collective_options {
  reduce_op op = reduce_op::sum;  ///< sum or avg (fixed per object: EF21's state depends on it)
  std::uint64_t seed = 0;         ///< keys stochastic rounding together with the step
  std::uint32_t first_step = 0;   ///< step of the first call; each call adds one
  /// Crossover (NCCL backend): calls on fewer than this many input bytes
  /// (count * sizeof(T)) run the plain NCCL collective instead, where the codec costs more
  /// than it saves. 0 = always low-bit. `calibrate()` measures it on the communicator's
  /// own links; docs/performance.md lists measured values. Ignored with EF21 (its state
  /// needs the codec) and on the MPI backend.
  std::size_t crossover_bytes = 0;
  /// all_reduce's algorithm (fixed per object: it sizes the workspace). Second-stage
  /// error feedback (feedback::residual<R, true>) acts on two_phase's re-encoding only.
  all_reduce_algorithm algorithm = all_reduce_algorithm::automatic;
  /// How the NCCL backend moves frames (fixed per object). Every choice but `nccl`
  /// registers the workspace with the communicator, which makes construction and
  /// destruction collective; choose `nccl` where NCCL cannot register windows.
  frame_transport transport = frame_transport::automatic;
  /// Deadline of every blocking wait (zero = wait forever). The MPI backend waits inside
  /// each call; the NCCL backend's calls never wait on the host, so it applies to sync()
  /// and to checked mode. On expiry every waiting rank throws lowbit::timeout_error
  /// naming the collective, its count and its step, and the communicator is marked
  /// unusable (NCCL: aborted), so later calls fail at once. Ten minutes by default, as
  /// torch.distributed's: long enough for a slow rank, short enough to end a hung job.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  /// Checked mode, for debugging (like TORCH_DISTRIBUTED_DEBUG=DETAIL): before each call,
  /// every rank all-gathers a 32-byte fingerprint of it (count, width, codec and
  /// configuration, step, call number) and every rank throws lowbit::agreement_error on a
  /// mismatch, before any frame moves. On NCCL it synchronises the host with the stream,
  /// so calls cannot be captured in a CUDA graph. Off by default; its cost is in
  /// docs/design.md.
  bool verify = false;
};

/// Backend tags: where the buffers live and what moves them.
namespace backend {
/// Device buffers on a cudaStream_t; NCCL moves the frames, CUDA kernels code them.
/// Include lowbit/collective/nccl.cuh.
struct nccl {
  static constexpr const char* name = "nccl";
};
/// Host buffers; MPI moves the frames, the host executor codes them (the reference,
/// and a CPU-only path). Include lowbit/collective/mpi.hpp.
struct mpi {
  static constexpr const char* name = "mpi";
};
}  // namespace backend

/// A compile-time set of code widths, for the run-time width entry points.
template <int... Bits>
struct bit_widths {
  static_assert(sizeof...(Bits) >= 1, "lowbit::bit_widths: give at least one width");
  static_assert(((Bits >= 1 && Bits <= 16) && ...), "lowbit::bit_widths: widths must be in 1..16");
};

}  // namespace lowbit
