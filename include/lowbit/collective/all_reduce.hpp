// lowbit::all_reduce: the low-bit all-reduce functor (and its run-time width variant).
#pragma once

#include <cstddef>
#include <string>

#include "lowbit/collective/detail/checks.hpp"
#include "lowbit/collective/detail/engine.hpp"
#include "lowbit/collective/types.hpp"

namespace lowbit {

/// A low-bit all-reduce over one communicator, for tensors of up to `max_count` T.
///
/// Per call: encode P shard frames (stage 0: input + feedback) -> all-to-all ->
/// decode and sum my shard in fp32, re-encode it (stage 1, + optional stage-2 residual)
/// -> all-gather of the reduced frames -> every rank decodes every frame. All ranks end
/// with bitwise-identical outputs; scales travel inside the frames.
///
/// Construction allocates the workspace and the feedback state (one object per
/// gradient bucket: the state belongs to the tensor); calls allocate nothing and, on
/// NCCL, never synchronise the host, so a call can be captured in a CUDA graph. Calls on
/// one object must be ordered (one stream, or synchronised): they share the workspace.
/// Every rank must call with the same count. The communicator wrapper is borrowed and
/// must outlive this object. Move-only.
///
/// Stochastic rounding is keyed by (options.seed, step, rank, element index): the same
/// inputs and seed give the same bytes run after run. Each call advances the step; a
/// captured CUDA graph replays the step it was captured with.
template <class T, class Codec, class Feedback = feedback::none,
          class Schedule = schedule::default_schedule, class Backend = backend::nccl>
class all_reduce {
  static_assert(detail::check_collective_params<T, Feedback, Schedule, Backend>());
  static_assert(detail::check_codec<Codec>());
  using engine_type = detail::engine<Backend, T, Feedback, Schedule, Codec>;

 public:
  using value_type = T;
  using codec_type = Codec;
  using feedback_type = Feedback;
  using schedule_type = Schedule;
  using backend_type = Backend;
  using comm_type = typename engine_type::comm_type;
  /// cudaStream_t on NCCL; an empty tag on the host backend.
  using stream_type = typename engine_type::stream_type;

  /// Allocates workspace and feedback state for counts up to max_count. Throws
  /// lowbit::invalid_argument for an empty or dead communicator.
  all_reduce(const comm_type& comm, std::size_t max_count, const collective_options& opts = {})
      : engine_(comm, max_count, opts, "lowbit::all_reduce") {}

  all_reduce(all_reduce&&) = default;
  all_reduce& operator=(all_reduce&&) = default;
  all_reduce(const all_reduce&) = delete;
  all_reduce& operator=(const all_reduce&) = delete;

  /// Reduces in[0, count) over the ranks into out[0, count) (in == out allowed),
  /// asynchronously on `stream` (NCCL) or before returning (MPI). count 0 is a no-op.
  void operator()(const T* in, T* out, std::size_t count, stream_type stream = {}) {
    engine_.template all_reduce<Codec>(in, out, count, stream, "lowbit::all_reduce");
  }

  /// The same with untyped buffers: throws lowbit::invalid_argument unless `type` is T's.
  void operator()(const void* in, void* out, std::size_t count, data_type type,
                  stream_type stream = {}) {
    LOWBIT_EXPECTS(type == data_type_of<T>(),
                   std::string("lowbit::all_reduce: buffers of type ") + to_string(type) +
                       " given to a collective built for " + to_string(data_type_of<T>()));
    (*this)(static_cast<const T*>(in), static_cast<T*>(out), count, stream);
  }

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
  /// Calls on fewer input bytes run the plain NCCL collective (collective_options::
  /// crossover_bytes; lowbit::calibrate_crossover measures it). Every rank must agree.
  std::size_t crossover_bytes() const noexcept { return engine_.crossover_bytes(); }
  void set_crossover_bytes(std::size_t bytes) noexcept { engine_.set_crossover_bytes(bytes); }
  const collective_options& options() const noexcept { return engine_.options(); }
  /// The algorithm calls run: one_shot or two_phase (options().algorithm resolved).
  all_reduce_algorithm algorithm() const noexcept { return engine_.algorithm(); }
  /// Zeroes the feedback state (not stream-ordered: call with no call in flight).
  void reset_feedback() { engine_.feedback_state().reset(); }
  /// The feedback state (its buffers are host or device memory, as the backend's).
  auto& feedback_state() noexcept { return engine_.feedback_state(); }

 private:
  engine_type engine_;
};

/// all_reduce with the code width chosen per call among a compiled set: `CodecOf<b>` is
/// the codec of width b, `Widths` a lowbit::bit_widths<...>. The workspace fits the
/// widest; the feedback state is shared by all widths (it belongs to the tensor, not
/// to a width), so a bucket can change width from one step to the next.
template <class T, template <int> class CodecOf, class Widths = bit_widths<1, 2, 4, 8>,
          class Feedback = feedback::none, class Schedule = schedule::default_schedule,
          class Backend = backend::nccl>
class dynamic_all_reduce;

template <class T, template <int> class CodecOf, int... Bits, class Feedback, class Schedule,
          class Backend>
class dynamic_all_reduce<T, CodecOf, bit_widths<Bits...>, Feedback, Schedule, Backend> {
  static_assert(detail::check_collective_params<T, Feedback, Schedule, Backend>());
  static_assert((detail::check_codec<CodecOf<Bits>>() && ...));
  static_assert(((CodecOf<Bits>::bits == Bits) && ...),
                "lowbit::dynamic_all_reduce: CodecOf<b> must have b-bit codes");
  using engine_type = detail::engine<Backend, T, Feedback, Schedule, CodecOf<Bits>...>;

 public:
  using value_type = T;
  using comm_type = typename engine_type::comm_type;
  using stream_type = typename engine_type::stream_type;

  dynamic_all_reduce(const comm_type& comm, std::size_t max_count,
                     const collective_options& opts = {})
      : engine_(comm, max_count, opts, "lowbit::dynamic_all_reduce") {}

  /// True when `bits` is one of the compiled widths.
  static constexpr bool supports(int bits) noexcept { return ((bits == Bits) || ...); }

  /// all_reduce at `bits` bits; throws lowbit::invalid_argument for a width outside
  /// the compiled set.
  void operator()(const T* in, T* out, std::size_t count, int bits, stream_type stream = {}) {
    if (!supports(bits)) {
      std::string set;
      ((set += (set.empty() ? "" : ", ") + std::to_string(Bits)), ...);
      LOWBIT_EXPECTS(false, "lowbit::dynamic_all_reduce: " + std::to_string(bits) +
                                " bits is not among the compiled widths {" + set + "}");
    }
    (void)((bits == Bits ? (engine_.template all_reduce<CodecOf<Bits>>(
                                in, out, count, stream, "lowbit::dynamic_all_reduce"),
                            true)
                         : false) ||
           ...);
  }

  std::size_t max_count() const noexcept { return engine_.max_count(); }
  /// Bytes of workspace and feedback state allocated at construction.
  std::size_t workspace_bytes() const noexcept { return engine_.workspace_bytes(); }
  int size() const noexcept { return engine_.size(); }
  int rank() const noexcept { return engine_.rank(); }
  std::uint32_t step() const noexcept { return engine_.step(); }
  void set_step(std::uint32_t s) noexcept { engine_.set_step(s); }
  /// Calls on fewer input bytes run the plain NCCL collective (collective_options::
  /// crossover_bytes; lowbit::calibrate_crossover measures it). Every rank must agree.
  std::size_t crossover_bytes() const noexcept { return engine_.crossover_bytes(); }
  void set_crossover_bytes(std::size_t bytes) noexcept { engine_.set_crossover_bytes(bytes); }
  /// The algorithm calls run: one_shot or two_phase (collective_options::algorithm resolved).
  all_reduce_algorithm algorithm() const noexcept { return engine_.algorithm(); }
  void reset_feedback() { engine_.feedback_state().reset(); }

 private:
  engine_type engine_;
};

}  // namespace lowbit
