// The device backend: device buffers, the CUDA codec kernels, NCCL moving the frames.
//
// Lanes: `compute` is the caller's stream; `comm` is an internal non-blocking stream of
// the greatest priority when a call has several chunks (the caller's stream otherwise,
// and always with schedule::flat). Lanes are linked by
// events only, so a call never waits on the host and can be captured in a CUDA graph
// (the internal stream forks from and joins back into the caller's stream).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <type_traits>
#include <vector>

#include "lowbit/collective/detail/device_buffer.cuh"
#include "lowbit/collective/detail/engine.hpp"
#include "lowbit/collective/detail/lsa_transport.cuh"
#include "lowbit/collective/detail/window_buffer.cuh"
#include "lowbit/comm/nccl_comm.hpp"
#include "lowbit/core/float_ops.hpp"
#include "lowbit/core/numeric.hpp"
#include "lowbit/kernels/kernels.cuh"

namespace lowbit::detail {

/// g[i] += delta[i]; out[i] = T(g[i]) (EF21's replicated state and output).
template <class U>
__global__ void accumulate_output_kernel(const float* __restrict__ delta, std::size_t n,
                                         float* __restrict__ g, U* __restrict__ out) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float v = lowbit::detail::fadd(g[i], delta[i]);
    g[i] = v;
    out[i] = from_float<U>(v);
  }
}

template <>
struct backend_impl<backend::nccl> {
  using comm_type = comm::nccl_comm;
  using stream_type = cudaStream_t;
  template <class U>
  using buffer = device_buffer<U>;
  /// The frames NCCL moves: a symmetric NCCL window when asked (see window_buffer).
  using transfer_buffer = window_buffer;
  /// The reduce kernels keep the fp32 sum in registers.
  static constexpr bool needs_sum_scratch = false;
  /// Below the crossover a call runs the plain NCCL collective (plain_* below).
  static constexpr bool has_plain = true;

  backend_impl(const comm_type& comm, int events, int streams) : comm_(&comm) {
    if (streams > 1) {
      // The transfers' stream outranks the codec's: an NCCL kernel issued while a codec
      // kernel's grid is still being dispatched would otherwise wait for its last wave,
      // and the pipeline would run serially.
      side_ = unique_stream::create_high_priority();
      events_.reserve(static_cast<std::size_t>(events) + 2);
      for (int i = 0; i < events + 2; ++i) events_.push_back(unique_event::create());
    }
  }

  static void check_comm(const comm_type& comm, const char* who) { comm.check(who); }
  /// frame_transport::automatic's choice: all-gathers of codes this wide are peer stores.
  /// Their frames make the transfer the bottleneck, where the peer-store kernel's speed
  /// pays for the SMs it takes: bf16 8-bit all_reduce 1.56-1.61x NCCL at 256 MiB-1 GiB
  /// against 1.39-1.44x for NCCL on the same windows; at 4 bits the codec is the
  /// bottleneck and NCCL's transfer, lighter on the SMs, won (bf16 2.35-2.46x against
  /// 2.06-2.23x).
  static constexpr int peer_store_min_bits = 8;
  /// Chooses how frames move, before any make_transfer_buffer, for codes of at most
  /// `widest_bits` bits. Collective over the communicator unless `t` is
  /// frame_transport::nccl (window registration, device-communicator creation).
  void set_transport(frame_transport t, int widest_bits) {
    symmetric_ = LOWBIT_HAS_NCCL_WINDOWS && t != frame_transport::nccl && comm_->size() > 1;
    min_store_bits_ = t == frame_transport::peer_stores ? 0 : peer_store_min_bits;
    if (symmetric_ && t != frame_transport::nccl_symmetric && widest_bits >= min_store_bits_)
      lsa_ = lsa_transport(comm_->get());
  }
  /// The transport the widest codes use: peer_stores only where every peer is load/store
  /// accessible.
  frame_transport transport() const noexcept {
    return lsa_.enabled() ? frame_transport::peer_stores
           : symmetric_   ? frame_transport::nccl_symmetric
                          : frame_transport::nccl;
  }
  /// Collective over the communicator with a symmetric transport (window registration).
  transfer_buffer make_transfer_buffer(std::size_t bytes) const {
    return window_buffer(comm_->get(), bytes, symmetric_);
  }
  static void check_sizes(std::size_t, std::size_t, std::size_t) {}
  void check_alive(const char* who) const { comm_->check(who); }

  /// Starts a call. With `overlap` (a call of several chunks) the transfers go to the
  /// internal stream; a one-chunk call stays on the caller's stream, where the fork, the
  /// join and the events would only add latency.
  void begin(cudaStream_t stream, bool overlap) {
    caller_ = stream;
    overlap_ = overlap && side_.get() != nullptr;
    if (overlap_) {  // fork: the transfer stream starts after the caller's prior work
      LOWBIT_CUDA_TRY(cudaEventRecord(fork_event(), caller_));
      LOWBIT_CUDA_TRY(cudaStreamWaitEvent(side_.get(), fork_event(), 0));
    }
  }
  void end() {
    if (overlap_) {  // join: the caller's stream continues after every transfer
      LOWBIT_CUDA_TRY(cudaEventRecord(join_event(), side_.get()));
      LOWBIT_CUDA_TRY(cudaStreamWaitEvent(caller_, join_event(), 0));
    }
  }
  void signal(lane l, int e) {
    if (overlap_) LOWBIT_CUDA_TRY(cudaEventRecord(events_[e].get(), stream(l)));
  }
  void wait(lane l, int e) {
    if (overlap_) LOWBIT_CUDA_TRY(cudaStreamWaitEvent(stream(l), events_[e].get(), 0));
  }

  template <class Codec, class T, class Fb>
  void encode(lane l, const T* x, std::size_t n, std::byte* frame, const rng_key& key,
              std::uint64_t index0, Fb fb) {
    kernels::encode<Codec, T, Fb>(x, n, frame, key, index0, fb, stream(l));
  }

  template <class Codec, class U>
  void decode(lane l, const std::byte* frame, std::size_t n, U* out, float scale) {
    kernels::decode<Codec, U>(frame, n, out, scale, stream(l));
  }

  /// decoded_out (may be null): what decode(out_frame, n, decoded_out, scale) would write,
  /// from the same pass.
  template <class Codec, class Fb, class U>
  void reduce_encode(lane l, const std::byte* frames, std::size_t stride, int num_frames,
                     std::size_t n, std::byte* out_frame, const rng_key& key, std::uint64_t index0,
                     Fb fb, float* /*acc: the kernel keeps the sum in registers*/, U* decoded_out,
                     float scale) {
    if (decoded_out != nullptr)
      kernels::decode_accumulate_encode_decode<Codec, Fb, U>(
          frames, stride, num_frames, n, out_frame, key, index0, fb, decoded_out, scale, stream(l));
    else
      kernels::decode_accumulate_encode<Codec, Fb>(frames, stride, num_frames, n, out_frame, key,
                                                   index0, fb, nullptr, stream(l));
  }

  template <class Codec, class U>
  void reduce(lane l, const std::byte* frames, std::size_t stride, int num_frames, std::size_t n,
              U* out, float scale, float* /*acc*/) {
    kernels::decode_accumulate<Codec, U>(frames, stride, num_frames, n, out, scale, stream(l));
  }

  template <class U>
  void accumulate_output(lane l, const float* delta, std::size_t n, float* g, U* out) {
    if (n == 0) return;
    const std::size_t threads = 256, blocks = (n + threads - 1) / threads;
    accumulate_output_kernel<U><<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535),
                                  static_cast<unsigned>(threads), 0, stream(l)>>>(delta, n, g, out);
    LOWBIT_CHECK_LAUNCH();
  }

  void alltoallv(lane l, const std::byte* send, const std::size_t* send_bytes,
                 const std::size_t* send_off, std::byte* recv, const std::size_t* recv_bytes,
                 const std::size_t* recv_off) {
    const int P = comm_->size();
    ncclComm_t c = comm_->get();
    LOWBIT_NCCL_TRY(ncclGroupStart());
    for (int p = 0; p < P; ++p) {
      if (send_bytes[p] > 0)
        LOWBIT_NCCL_TRY(ncclSend(send + send_off[p], send_bytes[p], ncclUint8, p, c, stream(l)));
      if (recv_bytes[p] > 0)
        LOWBIT_NCCL_TRY(ncclRecv(recv + recv_off[p], recv_bytes[p], ncclUint8, p, c, stream(l)));
    }
    LOWBIT_NCCL_TRY(ncclGroupEnd());
  }

  /// In place: P slots of slot_bytes at `offset` of buf; slot `rank` is this rank's;
  /// the frames hold `bits`-bit codes.
  void allgather(lane l, const transfer_buffer& buf, std::size_t offset, std::size_t slot_bytes,
                 int bits) {
    if (comm_->size() == 1) return;
    if (lsa_.enabled() && buf.symmetric() && bits >= min_store_bits_)
      return lsa_.allgather(buf, offset, slot_bytes, stream(l));
    std::byte* base = buf.data() + offset;
    LOWBIT_NCCL_TRY(ncclAllGather(base + static_cast<std::size_t>(comm_->rank()) * slot_bytes, base,
                                  slot_bytes, ncclUint8, comm_->get(), stream(l)));
  }

  // ---- plain NCCL, for calls below the crossover (on the caller's stream) ------------
  static ncclRedOp_t nccl_op(reduce_op op) { return op == reduce_op::avg ? ncclAvg : ncclSum; }

  template <class T>
  void plain_all_reduce(const T* in, T* out, std::size_t count, reduce_op op, cudaStream_t s) {
    LOWBIT_NCCL_TRY(
        ncclAllReduce(in, out, count, comm::nccl_data_type<T>(), nccl_op(op), comm_->get(), s));
  }
  /// lowbit's uneven block-aligned shards: one ncclReduce per owner, grouped.
  template <class T>
  void plain_reduce_scatter(const T* in, T* out, std::size_t count, std::size_t block, reduce_op op,
                            cudaStream_t s) {
    const int P = comm_->size();
    LOWBIT_NCCL_TRY(ncclGroupStart());
    for (int p = 0; p < P; ++p) {
      const schedule::range sh = schedule::shard(count, block, P, p);
      if (sh.count > 0)
        LOWBIT_NCCL_TRY(ncclReduce(in + sh.begin, out, sh.count, comm::nccl_data_type<T>(),
                                   nccl_op(op), p, comm_->get(), s));
    }
    LOWBIT_NCCL_TRY(ncclGroupEnd());
  }
  /// in = my shard; each owner broadcasts its shard into place, grouped.
  template <class T>
  void plain_all_gather(const T* in, T* out, std::size_t count, std::size_t block, cudaStream_t s) {
    const int P = comm_->size(), me = comm_->rank();
    LOWBIT_NCCL_TRY(ncclGroupStart());
    for (int p = 0; p < P; ++p) {
      const schedule::range sh = schedule::shard(count, block, P, p);
      if (sh.count > 0)
        LOWBIT_NCCL_TRY(ncclBroadcast(p == me ? in : out + sh.begin, out + sh.begin, sh.count,
                                      comm::nccl_data_type<T>(), p, comm_->get(), s));
    }
    LOWBIT_NCCL_TRY(ncclGroupEnd());
  }

 private:
  cudaStream_t stream(lane l) const { return l == lane::comm && overlap_ ? side_.get() : caller_; }
  cudaEvent_t fork_event() const { return events_[events_.size() - 2].get(); }
  cudaEvent_t join_event() const { return events_[events_.size() - 1].get(); }

  const comm_type* comm_;
  cudaStream_t caller_ = nullptr;
  bool overlap_ = false;
  bool symmetric_ = false;                    ///< transfer buffers are symmetric NCCL windows
  int min_store_bits_ = peer_store_min_bits;  ///< peer stores for codes at least this wide
  lsa_transport lsa_;                         ///< enabled: such all-gathers are peer stores
  unique_stream side_;
  std::vector<unique_event> events_;
};

}  // namespace lowbit::detail
