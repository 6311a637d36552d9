// lowbit::all_gather: quantized all-gather (weights, as ZeRO++ sends them).
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>

#include "lowbit/collective/detail/checks.hpp"
#include "lowbit/collective/detail/engine.hpp"
#include "lowbit/collective/types.hpp"
#include "lowbit/schedule/schedule.hpp"

namespace lowbit {

/// A low-bit all-gather of a `count`-element tensor partitioned as reduce_scatter
/// partitions it: each rank passes its shard `shard(count)`, encodes it once, the frames
/// are gathered, and every rank decodes all of them into out[0, count) (its own shard
/// too, so all ranks hold identical bytes). No error feedback: a weight is gathered,
/// not accumulated. Same lifetime, ordering and capture rules as lowbit::all_reduce.
template <class T, class Codec, class Schedule = schedule::default_schedule,
          class Backend = backend::nccl>
class all_gather {
  static_assert(detail::check_collective_params<T, feedback::none, Schedule, Backend>());
  static_assert(detail::check_codec<Codec>());
  using engine_type = detail::engine<Backend, T, feedback::none, Schedule, Codec>;

 public:
  using value_type = T;
  using codec_type = Codec;
  using comm_type = typename engine_type::comm_type;
  using stream_type = typename engine_type::stream_type;

  all_gather(const comm_type& comm, std::size_t max_count, const collective_options& opts = {})
      : engine_(comm, max_count, detail::scatter_gather_options(opts), "lowbit::all_gather") {}

  all_gather(all_gather&&) = default;
  all_gather& operator=(all_gather&&) = default;
  all_gather(const all_gather&) = delete;
  all_gather& operator=(const all_gather&) = delete;

  /// This rank's shard of a count-element tensor: what a call reads from `in`.
  schedule::range shard(std::size_t count) const { return engine_.template my_shard<Codec>(count); }

  /// in[0, shard(count).count) is my shard; out[0, count) gets the whole tensor.
  /// In place: in = out + shard(count).begin.
  void operator()(const T* in, T* out, std::size_t count, stream_type stream = {}) {
    engine_.template all_gather<Codec>(in, out, count, stream, "lowbit::all_gather");
  }

  /// Untyped buffers: throws lowbit::invalid_argument unless `type` is T's.
  void operator()(const void* in, void* out, std::size_t count, data_type type,
                  stream_type stream = {}) {
    LOWBIT_EXPECTS(type == data_type_of<T>(),
                   std::string("lowbit::all_gather: buffers of type ") + to_string(type) +
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

 private:
  engine_type engine_;
};

}  // namespace lowbit
