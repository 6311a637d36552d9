// lowbit::all_gather: quantized all-gather (weights, as ZeRO++ sends them).
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>

#include "lowbit/collective/detail/collective_base.hpp"
#include "lowbit/collective/types.hpp"
#include "lowbit/schedule/schedule.hpp"

namespace lowbit {

/// A low-bit all-gather of a `count`-element tensor partitioned as reduce_scatter
/// partitions it: each rank passes its shard `shard(count)`, encodes it once, the frames
/// are gathered, and every rank decodes all of them into out[0, count) (its own shard
/// too, so all ranks hold identical bytes). No error feedback: a weight is gathered,
/// not accumulated. Same lifetime, ordering and capture rules as lowbit::all_reduce: the
/// communicator must outlive the collective; a temporary is refused at compile time.
template <class T, class Codec, class Schedule = schedule::default_schedule,
          class Backend = backend::nccl>
class all_gather
    : public detail::all_gather_params<T, Codec, Schedule,
                                       Backend>::template base<detail::collective_base> {
  // The parameters' checks (detail/checks.hpp) fire when the base is named: first.
  using base = typename detail::all_gather_params<T, Codec, Schedule,
                                                  Backend>::template base<detail::collective_base>;

 public:
  using codec_type = Codec;
  using typename base::comm_type;
  using typename base::stream_type;

  all_gather(const comm_type& comm, std::size_t max_count, const collective_options& opts = {})
      : base(comm, max_count, opts, detail::collective_kind::scatter_gather, "lowbit::all_gather") {
  }
  /// Refused: the collective keeps a pointer to the communicator, which a temporary
  /// would leave dangling.
  all_gather(const comm_type&&, std::size_t, const collective_options& = {}) = delete;

  /// This rank's shard of a count-element tensor: what a call reads from `in`.
  schedule::range shard(std::size_t count) const {
    return this->engine_.template my_shard<Codec>(count);
  }

  /// in[0, shard(count).count) is my shard; out[0, count) gets the whole tensor.
  /// In place: in = out + shard(count).begin.
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
    base::check_type(type, "lowbit::all_gather");
    (*this)(static_cast<const T*>(in), static_cast<T*>(out), count, stream);
  }
  void async(const void* in, void* out, std::size_t count, data_type type, stream_type stream) {
    base::check_type(type, "lowbit::all_gather");
    async(static_cast<const T*>(in), static_cast<T*>(out), count, stream);
  }

 private:
  void run(const T* in, T* out, std::size_t count, stream_type stream) {
    this->engine_.template all_gather<Codec>(in, out, count, stream, "lowbit::all_gather");
  }
};

}  // namespace lowbit
