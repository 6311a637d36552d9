// lowbit::all_reduce: the low-bit all-reduce functor (and its run-time width variant).
#pragma once

#include <cstddef>
#include <string>

#include "lowbit/collective/detail/collective_base.hpp"
#include "lowbit/collective/types.hpp"

namespace lowbit {

/// A low-bit all-reduce over one communicator, for tensors of up to `max_count` T.
///
/// Per call, by collective_options::algorithm: one_shot (the default on 2 ranks) encodes
/// the input (stage 0: input + feedback), all-gathers every rank's frame, and every rank
/// decodes and sums all P frames in rank order; two_phase (the default on more ranks)
/// encodes P shard frames -> all-to-all -> decodes and sums my shard in fp32, re-encodes
/// it (stage 1, + optional stage-2 residual) -> all-gather of the reduced frames -> every
/// rank decodes every frame. Either way all ranks end with bitwise-identical outputs;
/// scales travel inside the frames.
///
/// Construction allocates the workspace and the feedback state (one object per
/// gradient bucket: the state belongs to the tensor); calls allocate nothing and, on
/// NCCL and node, never synchronise the host, so a call can be captured in a CUDA graph. Calls on
/// one object must be ordered (one stream, or synchronised): they share the workspace.
/// Every rank must call with the same count, in the same order: every frame carries a
/// header that its receiver checks before it writes anything (lowbit::agreement_error on
/// every rank, nothing written; on the device backends the kernels check it, raised by
/// sync() or the next call), every wait has a deadline (lowbit::timeout_error), and checked
/// mode (collective_options::verify) compares every rank's call before a frame moves
/// (docs/design.md, "Ranks that disagree"). The communicator wrapper is borrowed: the
/// communicator must outlive the collective; a temporary is refused at compile time.
/// Move-only.
///
/// Stochastic rounding is keyed by (options.seed, step, rank, element index): the same
/// inputs and seed give the same bytes run after run. Each call advances the step; a
/// captured CUDA graph replays the step it was captured with.
template <class T, class Codec, class Feedback = feedback::none,
          class Schedule = schedule::default_schedule, class Backend = backend::nccl>
class all_reduce
    : public detail::all_reduce_params<T, Codec, Feedback, Schedule,
                                       Backend>::template base<detail::collective_base> {
  // The parameters' checks (detail/checks.hpp) fire when the base is named: first.
  using base = typename detail::all_reduce_params<T, Codec, Feedback, Schedule,
                                                  Backend>::template base<detail::collective_base>;

 public:
  using codec_type = Codec;
  using typename base::comm_type;
  using typename base::stream_type;

  /// Allocates workspace and feedback state for counts up to max_count. Throws
  /// lowbit::invalid_argument for an empty or dead communicator.
  all_reduce(const comm_type& comm, std::size_t max_count, const collective_options& opts = {})
      : base(comm, max_count, opts, detail::collective_kind::all_reduce, "lowbit::all_reduce") {}
  /// Refused: the collective keeps a pointer to the communicator, which a temporary
  /// would leave dangling.
  all_reduce(const comm_type&&, std::size_t, const collective_options& = {}) = delete;

  /// Reduces in[0, count) over the ranks into out[0, count) (in == out allowed). count 0
  /// is a no-op.
  /// Returns when `out` holds the result: on NCCL and node async() then sync(stream), within
  /// options().timeout; on MPI the call itself.
  void operator()(const T* in, T* out, std::size_t count, stream_type stream = {}) {
    run(in, out, count, stream);
    this->sync(stream);
  }
  /// The same, enqueued on `stream` (NCCL, node): returns at once, without synchronising
  /// the host, so it can be captured in a CUDA graph; order later work after it on the
  /// stream, or wait with sync(stream).
  void async(const T* in, T* out, std::size_t count, stream_type stream) {
    base::require_async();
    run(in, out, count, stream);
  }

  /// The same with untyped buffers: throws lowbit::invalid_argument unless `type` is T's.
  void operator()(const void* in, void* out, std::size_t count, data_type type,
                  stream_type stream = {}) {
    base::check_type(type, "lowbit::all_reduce");
    (*this)(static_cast<const T*>(in), static_cast<T*>(out), count, stream);
  }
  void async(const void* in, void* out, std::size_t count, data_type type, stream_type stream) {
    base::check_type(type, "lowbit::all_reduce");
    async(static_cast<const T*>(in), static_cast<T*>(out), count, stream);
  }

 private:
  void run(const T* in, T* out, std::size_t count, stream_type stream) {
    this->engine_.template all_reduce<Codec>(in, out, count, stream, "lowbit::all_reduce");
  }

 public:
  /// The algorithm calls run: one_shot or two_phase (options().algorithm resolved).
  all_reduce_algorithm algorithm() const noexcept { return this->engine_.algorithm(); }
  /// The feedback state (its buffers are host or device memory, as the backend's).
  auto& feedback_state() noexcept { return this->engine_.feedback_state(); }
};

/// all_reduce with the code width chosen per call among a compiled set: `CodecOf<b>` is
/// the codec of width b, `Widths` a lowbit::bit_widths<...>. The workspace fits the
/// widest; the feedback state is shared by all widths (it belongs to the tensor, not
/// to a width), so a bucket can change width from one step to the next. Same lifetime,
/// ordering and capture rules as lowbit::all_reduce: the communicator must outlive the
/// collective; a temporary is refused at compile time.
template <class T, template <int> class CodecOf, class Widths = bit_widths<1, 2, 4, 8>,
          class Feedback = feedback::none, class Schedule = schedule::default_schedule,
          class Backend = backend::nccl>
class dynamic_all_reduce {
  // Widths is not a lowbit::bit_widths: the readable error, and nothing else.
  static_assert(sizeof(detail::dynamic_all_reduce_widths<Widths>) > 0);

 public:
  template <class... Args>
  explicit dynamic_all_reduce(Args&&...) {}
};

template <class T, template <int> class CodecOf, int... Bits, class Feedback, class Schedule,
          class Backend>
class dynamic_all_reduce<T, CodecOf, bit_widths<Bits...>, Feedback, Schedule, Backend>
    : public detail::dynamic_all_reduce_params<T, CodecOf, Feedback, Schedule, Backend,
                                               Bits...>::template base<detail::collective_base> {
  // The parameters' checks (detail/checks.hpp) fire when the base is named: first.
  using base =
      typename detail::dynamic_all_reduce_params<T, CodecOf, Feedback, Schedule, Backend,
                                                 Bits...>::template base<detail::collective_base>;

 public:
  using typename base::comm_type;
  using typename base::stream_type;

  dynamic_all_reduce(const comm_type& comm, std::size_t max_count,
                     const collective_options& opts = {})
      : base(comm, max_count, opts, detail::collective_kind::all_reduce,
             "lowbit::dynamic_all_reduce") {}
  /// Refused: the collective keeps a pointer to the communicator, which a temporary
  /// would leave dangling.
  dynamic_all_reduce(const comm_type&&, std::size_t, const collective_options& = {}) = delete;

  /// True when `bits` is one of the compiled widths.
  static constexpr bool supports(int bits) noexcept { return ((bits == Bits) || ...); }

  /// all_reduce at `bits` bits, returning when `out` holds the result (as
  /// all_reduce::operator()); throws lowbit::invalid_argument for a width outside the
  /// compiled set.
  void operator()(const T* in, T* out, std::size_t count, int bits, stream_type stream = {}) {
    run(in, out, count, bits, stream);
    this->sync(stream);
  }
  /// The same, enqueued on `stream` (NCCL, node), as all_reduce::async.
  void async(const T* in, T* out, std::size_t count, int bits, stream_type stream) {
    base::require_async();
    run(in, out, count, bits, stream);
  }

 private:
  void run(const T* in, T* out, std::size_t count, int bits, stream_type stream) {
    at_width(bits, [&](auto codec) {
      this->engine_.template all_reduce<decltype(codec)>(in, out, count, stream,
                                                         "lowbit::dynamic_all_reduce");
    });
  }

  /// Calls f(CodecOf<bits>{}) for a compiled width; lowbit::invalid_argument naming the
  /// compiled set otherwise.
  template <class F>
  void at_width(int bits, F&& f) const {
    if (!supports(bits)) {
      std::string set;
      ((set += (set.empty() ? "" : ", ") + std::to_string(Bits)), ...);
      LOWBIT_EXPECTS(false, "lowbit::dynamic_all_reduce: " + std::to_string(bits) +
                                " bits is not among the compiled widths {" + set + "}");
    }
    (void)((bits == Bits ? (f(CodecOf<Bits>{}), true) : false) || ...);
  }

 public:
  /// The algorithm calls run: one_shot or two_phase (collective_options::algorithm resolved).
  all_reduce_algorithm algorithm() const noexcept { return this->engine_.algorithm(); }
  /// The feedback state, shared by every width (its buffers are host or device memory,
  /// as the backend's).
  auto& feedback_state() noexcept { return this->engine_.feedback_state(); }
  /// [begin, end) of the values of a `count`-value call at `bits` that this rank reduces
  /// and re-encodes under two_phase: where the feedback state's second-stage residual
  /// lies (its element 0 is value begin). Throws for a width outside the compiled set.
  schedule::range reduced_shard(std::size_t count, int bits) const {
    schedule::range r{};
    at_width(bits,
             [&](auto codec) { r = this->engine_.template my_shard<decltype(codec)>(count); });
    return r;
  }
};

}  // namespace lowbit
