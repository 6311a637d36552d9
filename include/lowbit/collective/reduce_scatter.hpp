// lowbit::reduce_scatter: the first half of the low-bit all-reduce.
#pragma once

#include <cstddef>
#include <string>

#include "lowbit/collective/detail/checks.hpp"
#include "lowbit/collective/detail/engine.hpp"
#include "lowbit/collective/types.hpp"
#include "lowbit/schedule/schedule.hpp"

namespace lowbit {

/// A low-bit reduce-scatter: every rank encodes its `count`-element input once per
/// shard (stage 0), the frames go all-to-all, and each rank returns its own shard
/// `shard(count)` (whole quantizer blocks, lowbit::schedule::shard) as the exact fp32
/// sum of the P decoded frames, times 1/P for avg, rounded once to T. There is a
/// single quantization per value (the owner never re-encodes), so the error is that of
/// one encode. Feedback: none, residual (stage 0) or ef21 (g over my shard; the output
/// is g). Same lifetime, ordering and capture rules as lowbit::all_reduce.
template <class T, class Codec, class Feedback = feedback::none,
          class Schedule = schedule::default_schedule, class Backend = backend::nccl>
class reduce_scatter {
  static_assert(detail::check_collective_params<T, Feedback, Schedule, Backend>());
  static_assert(detail::check_codec<Codec>());
  using engine_type = detail::engine<Backend, T, Feedback, Schedule, Codec>;

 public:
  using value_type = T;
  using codec_type = Codec;
  using comm_type = typename engine_type::comm_type;
  using stream_type = typename engine_type::stream_type;

  reduce_scatter(const comm_type& comm, std::size_t max_count, const collective_options& opts = {})
      : engine_(comm, max_count, detail::scatter_gather_options(opts), "lowbit::reduce_scatter") {}

  reduce_scatter(reduce_scatter&&) = default;
  reduce_scatter& operator=(reduce_scatter&&) = default;
  reduce_scatter(const reduce_scatter&) = delete;
  reduce_scatter& operator=(const reduce_scatter&) = delete;

  /// This rank's shard of a count-element tensor: what a call writes to `out`.
  schedule::range shard(std::size_t count) const { return engine_.template my_shard<Codec>(count); }

  /// Reduces in[0, count) over the ranks; out[0, shard(count).count) gets my shard.
  /// `out` may alias `in` (e.g. out = in + shard(count).begin).
  void operator()(const T* in, T* out, std::size_t count, stream_type stream = {}) {
    engine_.template reduce_scatter<Codec>(in, out, count, stream, "lowbit::reduce_scatter");
  }

  /// Untyped buffers: throws lowbit::invalid_argument unless `type` is T's.
  void operator()(const void* in, void* out, std::size_t count, data_type type,
                  stream_type stream = {}) {
    LOWBIT_EXPECTS(type == data_type_of<T>(),
                   std::string("lowbit::reduce_scatter: buffers of type ") + to_string(type) +
                       " given to a collective built for " + to_string(data_type_of<T>()));
    (*this)(static_cast<const T*>(in), static_cast<T*>(out), count, stream);
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
  void reset_feedback() { engine_.feedback_state().reset(); }

 private:
  engine_type engine_;
};

}  // namespace lowbit
