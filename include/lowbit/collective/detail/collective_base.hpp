// What every collective object shares: the readable checks of its template parameters
// (stated before the engine is instantiated, so they are the first errors a wrong
// parameter produces), the engine that holds the workspace, feedback state and
// schedule, and the accessors that forward to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "lowbit/collective/backend.hpp"
#include "lowbit/collective/detail/checks.hpp"
#include "lowbit/collective/detail/engine.hpp"
#include "lowbit/collective/types.hpp"
#include "lowbit/core/error.hpp"

namespace lowbit::detail {

/// Reaches a flat collective's engine: the hierarchical collectives drive their stage-2
/// collective chunk by chunk (engine::chunks, chunk_ranges, and the Links of a call).
struct engine_access {
  template <class C>
  static auto& of(C& c) noexcept {
    return c.engine_;
  }
};

template <class Backend, class T, class Feedback, class Schedule, class... Codecs>
class collective_base {
  friend struct engine_access;

  static_assert(check_collective_params<T, Feedback, Schedule, Backend>());
  static_assert((check_codec<Codecs>() && ...));

 protected:
  using engine_type = engine<Backend, T, Feedback, Schedule, Codecs...>;

 public:
  using value_type = T;
  using feedback_type = Feedback;
  using schedule_type = Schedule;
  using backend_type = Backend;
  using comm_type = typename engine_type::comm_type;
  /// cudaStream_t on NCCL and node; an empty tag on the host backend.
  using stream_type = typename engine_type::stream_type;

  collective_base(collective_base&&) = default;
  collective_base& operator=(collective_base&&) = default;
  collective_base(const collective_base&) = delete;
  collective_base& operator=(const collective_base&) = delete;

  /// The largest count a call accepts.
  std::size_t max_count() const noexcept { return engine_.max_count(); }
  /// Bytes of workspace and feedback state allocated at construction.
  std::size_t workspace_bytes() const noexcept { return engine_.workspace_bytes(); }
  /// Ranks of the communicator, and this rank.
  int size() const noexcept { return engine_.size(); }
  int rank() const noexcept { return engine_.rank(); }
  /// The step the next call uses for stochastic rounding (each call adds one).
  std::uint32_t step() const noexcept { return engine_.step(); }
  void set_step(std::uint32_t s) noexcept { engine_.set_step(s); }
  /// Calls on fewer input bytes run the backend's own full-precision collective where it
  /// has one (NCCL: collective_options::crossover_bytes; lowbit::calibrate_crossover
  /// measures it; ignored on node and MPI). Every rank must agree.
  std::size_t crossover_bytes() const noexcept { return engine_.crossover_bytes(); }
  void set_crossover_bytes(std::size_t bytes) noexcept { engine_.set_crossover_bytes(bytes); }
  const collective_options& options() const noexcept { return engine_.options(); }
  /// How frames move between GPUs (options().transport resolved for this communicator;
  /// automatic on the MPI backend, peer_stores on the node backend).
  frame_transport transport() const noexcept { return engine_.transport(); }
  /// Waits until this object's calls on `stream` have finished (NCCL), within
  /// options().timeout: a rank that never joined makes it throw lowbit::timeout_error
  /// (naming the collective, its last count and step) and abort the communicator, instead
  /// of hanging. A no-op on the MPI backend, whose calls finish before they return.
  /// A disagreement that the kernels of an earlier call found in its frames' headers
  /// (NCCL) is raised here, or by the next call, whichever comes first: see all_reduce.
  void sync(stream_type stream = {}) { engine_.sync(stream, engine_.name()); }
  /// Zeroes the feedback state (not stream-ordered: call with no call in flight); a
  /// no-op without feedback.
  void reset_feedback() { engine_.feedback_state().reset(); }

 protected:
  collective_base(const typename engine_type::comm_type& comm, std::size_t max_count,
                  const collective_options& opts, collective_kind kind, const char* who)
      : engine_(comm, max_count, opts, kind, who) {}
  ~collective_base() = default;

  /// async() exists where calls are stream-ordered (NCCL, node): a readable error elsewhere.
  static void require_async() {
    static_assert(stream_ordered_v<Backend>,
                  "lowbit: async() enqueues a call on a CUDA stream, which this backend does "
                  "not have; on the MPI backend operator() completes the call before returning");
  }

  /// The untyped entry points' check: throws lowbit::invalid_argument unless `type` is T's.
  static void check_type(data_type type, const char* who) {
    LOWBIT_EXPECTS(type == data_type_of<T>(),
                   std::string(who) + ": buffers of type " + to_string(type) +
                       " given to a collective built for " + to_string(data_type_of<T>()));
  }

  engine_type engine_;
};

}  // namespace lowbit::detail
