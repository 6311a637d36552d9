// lowbit::reduce_scatter: the first half of the low-bit all-reduce.
#pragma once

#include <cstddef>
#include <string>

#include "lowbit/collective/detail/collective_base.hpp"
#include "lowbit/collective/types.hpp"
#include "lowbit/schedule/schedule.hpp"

namespace lowbit {

/// A low-bit reduce-scatter: every rank encodes its `count`-element input once per
/// shard (stage 0), the frames go all-to-all, and each rank returns its own shard
/// `shard(count)` (whole quantizer blocks, lowbit::schedule::shard) as the exact fp32
/// sum of the P decoded frames, times 1/P for avg, rounded once to T. There is a
/// single quantization per value (the owner never re-encodes), so the error is that of
/// one encode. Feedback: none, residual (stage 0) or ef21 (g over my shard; the output
/// is g). Same lifetime, ordering and capture rules as lowbit::all_reduce: the
/// communicator must outlive the collective; a temporary is refused at compile time.
template <class T, class Codec, class Feedback = feedback::none,
          class Schedule = schedule::default_schedule, class Backend = backend::nccl>
class reduce_scatter
    : public detail::reduce_scatter_params<T, Codec, Feedback, Schedule,
                                           Backend>::template base<detail::collective_base> {
  // The parameters' checks (detail/checks.hpp) fire when the base is named: first.
  using base =
      typename detail::reduce_scatter_params<T, Codec, Feedback, Schedule,
                                             Backend>::template base<detail::collective_base>;

 public:
  using codec_type = Codec;
  using typename base::comm_type;
  using typename base::stream_type;

  reduce_scatter(const comm_type& comm, std::size_t max_count, const collective_options& opts = {})
      : base(comm, max_count, opts, detail::collective_kind::scatter_gather,
             "lowbit::reduce_scatter") {}
  /// Refused: the collective keeps a pointer to the communicator, which a temporary
  /// would leave dangling.
  reduce_scatter(const comm_type&&, std::size_t, const collective_options& = {}) = delete;

  /// This rank's shard of a count-element tensor: what a call writes to `out`.
  schedule::range shard(std::size_t count) const {
    return this->engine_.template my_shard<Codec>(count);
  }

  /// The feedback state (its buffers are host or device memory, as the backend's): with
  /// feedback::residual the residual e over the whole input, from element 0.
  auto& feedback_state() noexcept { return this->engine_.feedback_state(); }

  /// Reduces in[0, count) over the ranks; out[0, shard(count).count) gets my shard.
  /// `out` may alias `in` only in place, as out = in + shard(count).begin (what NCCL's own
  /// in-place reduce_scatter is, below the crossover); other overlaps are undefined.
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

  /// Untyped buffers: throws lowbit::invalid_argument unless `type` is T's.
  void operator()(const void* in, void* out, std::size_t count, data_type type,
                  stream_type stream = {}) {
    base::check_type(type, "lowbit::reduce_scatter");
    (*this)(static_cast<const T*>(in), static_cast<T*>(out), count, stream);
  }
  void async(const void* in, void* out, std::size_t count, data_type type, stream_type stream) {
    base::check_type(type, "lowbit::reduce_scatter");
    async(static_cast<const T*>(in), static_cast<T*>(out), count, stream);
  }

 private:
  void run(const T* in, T* out, std::size_t count, stream_type stream) {
    this->engine_.template reduce_scatter<Codec>(in, out, count, stream, "lowbit::reduce_scatter");
  }
};

}  // namespace lowbit
