// The host backend: host buffers, the host codec executor, MPI moving the frames.
// Every step runs to completion when issued, so the lanes and events are no-ops.
#pragma once

#include <climits>
#include <cstddef>
#include <string>
#include <vector>

#include "lowbit/collective/detail/engine.hpp"
#include "lowbit/collective/detail/host_buffer.hpp"
#include "lowbit/comm/mpi_comm.hpp"
#include "lowbit/core/float_ops.hpp"
#include "lowbit/host/codec_executor.hpp"

namespace lowbit::detail {

template <>
struct backend_impl<backend::mpi> {
  using comm_type = comm::mpi_comm;
  /// The host backend has no streams: calls complete before they return.
  struct stream_type {};
  template <class U>
  using buffer = host_buffer<U>;
  using transfer_buffer = host_buffer<std::byte>;
  /// The host executor sums a shard's frames in an fp32 scratch array.
  static constexpr bool needs_sum_scratch = true;
  /// No plain fallback: the host backend always runs the codec (it is the reference).
  static constexpr bool has_plain = false;

  backend_impl(const comm_type& comm, int /*events*/, int /*streams*/)
      : comm_(&comm),
        sc_(static_cast<std::size_t>(comm.size())),
        sd_(sc_.size()),
        rc_(sc_.size()),
        rd_(sc_.size()) {}

  static void check_comm(const comm_type& comm, const char* who) { comm.check(who); }
  /// MPI moves plain host memory: there is nothing to register or choose.
  void set_transport(frame_transport, int /*widest_bits*/) {}
  static frame_transport transport() noexcept { return frame_transport::automatic; }
  static transfer_buffer make_transfer_buffer(std::size_t bytes) { return transfer_buffer(bytes); }
  static void check_sizes(std::size_t send, std::size_t recv, std::size_t gather) {
    LOWBIT_EXPECTS(send <= INT_MAX && recv <= INT_MAX && gather <= INT_MAX,
                   "lowbit (mpi backend): max_count too large: MPI counts are int, a frame "
                   "buffer would exceed 2 GiB");
  }
  void check_alive(const char* who) const { comm_->check(who); }

  void begin(stream_type, bool /*overlap*/) {}
  void end() {}
  void signal(lane, int) {}
  void wait(lane, int) {}

  template <class Codec, class T, class Fb>
  void encode(lane, const T* x, std::size_t n, std::byte* frame, const rng_key& key,
              std::uint64_t index0, Fb fb) {
    host::encode<Codec>(span<const T>(x, n), span<std::byte>(frame, Codec::frame_bytes(n)), key,
                        index0, fb);
  }

  template <class Codec, class U>
  void decode(lane, const std::byte* frame, std::size_t n, U* out, float scale) {
    host::decode<Codec>(span<const std::byte>(frame, Codec::frame_bytes(n)), span<U>(out, n),
                        scale);
  }

  /// decoded_out (may be null) gets the new frame decoded, times scale.
  template <class Codec, class Fb, class U>
  void reduce_encode(lane l, const std::byte* frames, std::size_t stride, int num_frames,
                     std::size_t n, std::byte* out_frame, const rng_key& key, std::uint64_t index0,
                     Fb fb, float* acc, U* decoded_out, float scale) {
    host::decode_accumulate_encode<Codec>(frames, stride, num_frames, span<float>(acc, n),
                                          span<std::byte>(out_frame, Codec::frame_bytes(n)), key,
                                          index0, fb);
    if (decoded_out != nullptr) decode<Codec>(l, out_frame, n, decoded_out, scale);
  }

  /// out = scale * (sum of the decoded frames), summed in fp32 in rank order.
  template <class Codec, class U>
  void reduce(lane, const std::byte* frames, std::size_t stride, int num_frames, std::size_t n,
              U* out, float scale, float* acc) {
    for (std::size_t i = 0; i < n; ++i) acc[i] = 0.0f;
    for (int p = 0; p < num_frames; ++p)
      host::decode_accumulate<Codec>(span<const std::byte>(frames + p * stride, stride),
                                     span<float>(acc, n));
    for (std::size_t i = 0; i < n; ++i)
      out[i] = from_float<U>(scale != 1.0f ? fmul(acc[i], scale) : acc[i]);
  }

  /// g += delta; out = g (EF21's replicated state and output).
  template <class U>
  void accumulate_output(lane, const float* delta, std::size_t n, float* g, U* out) {
    for (std::size_t i = 0; i < n; ++i) {
      g[i] = fadd(g[i], delta[i]);
      out[i] = from_float<U>(g[i]);
    }
  }

  void alltoallv(lane, const std::byte* send, const std::size_t* send_bytes,
                 const std::size_t* send_off, std::byte* recv, const std::size_t* recv_bytes,
                 const std::size_t* recv_off) {
    for (std::size_t p = 0; p < sc_.size(); ++p) {
      sc_[p] = static_cast<int>(send_bytes[p]);
      sd_[p] = static_cast<int>(send_off[p]);
      rc_[p] = static_cast<int>(recv_bytes[p]);
      rd_[p] = static_cast<int>(recv_off[p]);
    }
    LOWBIT_MPI_TRY(MPI_Alltoallv(send, sc_.data(), sd_.data(), MPI_BYTE, recv, rc_.data(),
                                 rd_.data(), MPI_BYTE, comm_->get()));
  }

  /// In place: slot `rank` of buf is this rank's contribution.
  void allgather(lane, transfer_buffer& buf, std::size_t offset, std::size_t slot_bytes,
                 int /*bits*/) {
    LOWBIT_MPI_TRY(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf.data() + offset,
                                 static_cast<int>(slot_bytes), MPI_BYTE, comm_->get()));
  }

 private:
  const comm_type* comm_;
  std::vector<int> sc_, sd_, rc_, rd_;
};

}  // namespace lowbit::detail
