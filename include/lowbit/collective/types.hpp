// Vocabulary shared by the collectives: reduce ops, options, element-type tags and the
// backend tags. frame_transport and its tuning policy live in lowbit/transport/ and are
// re-exported here.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "lowbit/core/numeric.hpp"
#include "lowbit/transport/frame_transport.hpp"
#include "lowbit/transport/nccl/policy.hpp"

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
  /// (count * sizeof(T)) run NCCL's own collective instead, where the codec costs more
  /// than it saves. 0 = always low-bit. `lowbit::calibrate_crossover()` measures it on the
  /// communicator's own links; docs/performance.md lists measured values. Ignored with EF21 (its
  /// state needs the codec) and on the MPI backend.
  std::size_t crossover_bytes = 0;
  /// all_reduce's algorithm (fixed per object: it sizes the workspace). Second-stage
  /// error feedback (feedback::residual<R, true>) acts on two_phase's re-encoding only.
  all_reduce_algorithm algorithm = all_reduce_algorithm::automatic;
  /// How the NCCL backend moves frames (fixed per object). Every choice but `nccl`
  /// registers the workspace with the communicator, which makes construction and
  /// destruction collective; choose `nccl` where NCCL cannot register windows.
  frame_transport transport = frame_transport::automatic;
  /// Thresholds of `automatic` between the transports, and the peer-store kernel's size
  /// (fixed per object; the same on every rank). transport::default_policy() by default:
  /// measured on 2x H200 over NVLink; see transport::policy for what each field does.
  ::lowbit::transport::policy transport_policy = ::lowbit::transport::default_policy();
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

/// The base of every backend tag: a type deriving from it names a backend, whose
/// implementation is lowbit::backend_impl<Tag> (collective/backend.hpp, the extension point).
struct backend_tag {};
/// True when B is a backend tag.
template <class B>
inline constexpr bool is_backend_tag_v = std::is_base_of_v<backend_tag, B>;

/// lowbit's backend tags: where the buffers live and what moves them.
namespace backend {
/// Device buffers on a cudaStream_t; NCCL moves the frames, CUDA kernels code them.
/// Include lowbit/collective/nccl.cuh.
struct nccl : backend_tag {
  static constexpr const char* name = "nccl";
};
/// Host buffers; MPI moves the frames, the host executor codes them (the reference,
/// and a CPU-only path). Include lowbit/collective/mpi.hpp.
struct mpi : backend_tag {
  static constexpr const char* name = "mpi";
};
/// Device buffers on a cudaStream_t for the ranks of one node, without NCCL: each rank
/// maps its peers' workspace with CUDA IPC and stores its frames into them (several ranks
/// may share one GPU). Include lowbit/collective/node.cuh.
struct node : backend_tag {
  static constexpr const char* name = "node";
};
}  // namespace backend

/// A compile-time set of code widths, for the run-time width entry points.
template <int... Bits>
struct bit_widths {
  static_assert(sizeof...(Bits) >= 1, "lowbit::bit_widths: give at least one width");
  static_assert(((Bits >= 1 && Bits <= 16) && ...), "lowbit::bit_widths: widths must be in 1..16");
};

}  // namespace lowbit
