// The device backend: device buffers, the CUDA codec kernels, and a transport::frame_mover
// moving the frames (which transport, and the transfers themselves: lowbit/transport/).
//
// Frame headers are written and checked by the codec kernels themselves
// (kernels/frame_check.cuh): a kernel that consumes frames checks the headers of its call's
// frames before it writes anything and records the first disagreement in mapped host
// memory, which the engine reads at sync() and at the next call.
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
#include <string>
#include <type_traits>
#include <vector>

#include "lowbit/collective/detail/backend_concept.hpp"
#include "lowbit/collective/detail/device_buffer.cuh"
#include "lowbit/collective/detail/engine.hpp"
#include "lowbit/collective/detail/frame_header.hpp"
#include "lowbit/comm/nccl_comm.hpp"
#include "lowbit/core/float_ops.hpp"
#include "lowbit/core/numeric.hpp"
#include "lowbit/kernels/frame_check.cuh"
#include "lowbit/kernels/kernels.cuh"
#include "lowbit/transport/frame_mover.cuh"
#include "lowbit/transport/window_buffer.cuh"

namespace lowbit::detail {

/// g[i] += delta[i]; out[i] = T(g[i]) (EF21's replicated state and output), unless a
/// header `check` names disagrees (then delta was never written).
template <class U>
__global__ void accumulate_output_kernel(const float* __restrict__ delta, std::size_t n,
                                         float* __restrict__ g, U* __restrict__ out,
                                         kernels::header_check check) {
  if (!kernels::detail::frames_agree(check)) return;
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
  /// The frames the transport moves: symmetric NCCL windows when asked.
  using transfer_buffer = lowbit::transport::window_buffer;
  /// The reduce kernels keep the fp32 sum in registers.
  static constexpr bool needs_sum_scratch = false;
  /// Below the crossover a call runs the plain NCCL collective (plain_* below).
  static constexpr bool has_plain = true;
  /// Every frame starts with a frame_header, written by the kernel that writes the frame
  /// and checked by the kernels that read it.
  static constexpr std::size_t header_bytes = sizeof(frame_header);
  /// Frames live in device memory: the host never reads a header.
  static constexpr bool host_frames = false;

  backend_impl(const comm_type& comm, int events, int streams)
      : comm_(&comm), mover_(comm), mismatch_(mapped_host<kernels::header_mismatch>::create()) {
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
  /// Chooses how frames move, before any make_transfer_buffer, for codes of at most
  /// `widest_bits` bits (transport::frame_mover). Collective over the communicator
  /// unless `t` is frame_transport::nccl.
  void set_transport(frame_transport t, const lowbit::transport::policy& p, int widest_bits) {
    mover_ = lowbit::transport::frame_mover(*comm_, t, widest_bits, p);
  }
  /// The transport of the largest all-gathers of the widest codes (automatic resolved).
  frame_transport transport() const noexcept { return mover_.transport(); }
  /// Collective over the communicator with a symmetric transport (window registration).
  transfer_buffer make_transfer_buffer(std::size_t bytes) const {
    return mover_.make_buffer(bytes);
  }
  static void check_sizes(std::size_t, std::size_t, std::size_t) {}
  void check_alive(const char* who) const { comm_->check(who); }

  /// out = in on the stream (a one-rank call); nothing when they alias exactly.
  template <class U>
  void copy(const U* in, U* out, std::size_t n, cudaStream_t stream) {
    if (in != out && n > 0)
      LOWBIT_CUDA_TRY(cudaMemcpyAsync(out, in, n * sizeof(U), cudaMemcpyDeviceToDevice, stream));
  }
  /// The header of a frame with no values, flagged poisoned if a header of `check`
  /// disagrees.
  void stamp(lane l, std::byte* slot, const frame_header& h, const header_set& check) {
    kernels::stamp_header({device_check(check), {slot, h}}, stream(l));
  }
  /// The first disagreement a kernel of this object recorded, as mismatch() words it, with
  /// the call it was found in; empty while none (or while the kernel has not run yet).
  std::string disagreement() const {
    const volatile kernels::header_mismatch* r = mismatch_.get();
    if (r->ready == 0) return {};
    const kernels::header_mismatch m =
        *const_cast<const kernels::header_mismatch*>(mismatch_.get());
    return "in call " + std::to_string(m.want.seq) + " of this collective object, " +
           mismatch(m.got, m.want, m.from);
  }

  /// Every rank's `bytes` at `mine` (host memory), rank by rank, in host memory: checked
  /// mode's fingerprints. Synchronises the host with the caller's stream (caller_ of the
  /// call being checked), within cc.timeout; on expiry the communicator is aborted.
  const std::byte* allgather_small(const void* mine, std::size_t bytes, call_check& cc) {
    const std::size_t total = bytes * static_cast<std::size_t>(comm_->size());
    if (small_dev_.size() < total) {  // checked mode only: allocated on its first call
      small_dev_ = device_buffer<std::byte>(total);
      small_host_.assign(total, std::byte{0});
    }
    std::byte* mine_dev = small_dev_.data() + static_cast<std::size_t>(comm_->rank()) * bytes;
    LOWBIT_CUDA_TRY(cudaMemcpyAsync(mine_dev, mine, bytes, cudaMemcpyHostToDevice, check_stream_));
    LOWBIT_NCCL_TRY(
        ncclAllGather(mine_dev, small_dev_.data(), bytes, ncclUint8, comm_->get(), check_stream_));
    LOWBIT_CUDA_TRY(cudaMemcpyAsync(small_host_.data(), small_dev_.data(), total,
                                    cudaMemcpyDeviceToHost, check_stream_));
    wait_for(check_stream_, cc);
    return small_host_.data();
  }
  /// The stream checked mode's exchange runs on (the caller's, set by the engine).
  void set_check_stream(cudaStream_t s) { check_stream_ = s; }

  /// Waits until `stream` is idle within cc.timeout, polling NCCL's asynchronous error:
  /// lowbit::timeout_error (communicator aborted) on expiry, lowbit::nccl_error on an NCCL
  /// error.
  void wait_for(cudaStream_t stream, const call_check& cc) {
    try {
      comm_->sync(stream, cc.timeout);
    } catch (const timeout_error&) {
      throw timeout_error(__FILE__, __LINE__, cc.timeout_message("the work on the stream"));
    }
  }

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

  /// `header`: written in front of the frame (at frame - header_bytes) by the same kernel.
  template <class Codec, class T, class Fb>
  void encode(lane l, const T* x, std::size_t n, std::byte* frame, const rng_key& key,
              std::uint64_t index0, Fb fb, const frame_header& header) {
    kernels::encode<Codec, T, Fb>(x, n, frame, key, index0, fb, stream(l),
                                  {frame - header_bytes, header});
  }

  /// Writes nothing unless every header of `check` agrees.
  template <class Codec, class U>
  void decode(lane l, const std::byte* frame, std::size_t n, U* out, float scale,
              const header_set& check) {
    kernels::decode<Codec, U>(frame, n, out, scale, stream(l), device_check(check));
  }

  /// decoded_out (may be null): what decode(out_frame, n, decoded_out, scale) would write,
  /// from the same pass. When a header of `check` disagrees nothing is written but
  /// out_frame's header, poisoned.
  template <class Codec, class Fb, class U>
  void reduce_encode(lane l, const std::byte* frames, std::size_t stride, int num_frames,
                     std::size_t n, std::byte* out_frame, const rng_key& key, std::uint64_t index0,
                     Fb fb, float* /*acc: the kernel keeps the sum in registers*/, U* decoded_out,
                     float scale, const header_set& check, const frame_header& header) {
    const kernels::framing fr{device_check(check), {out_frame - header_bytes, header}};
    if (decoded_out != nullptr)
      kernels::decode_accumulate_encode_decode<Codec, Fb, U>(frames, stride, num_frames, n,
                                                             out_frame, key, index0, fb,
                                                             decoded_out, scale, stream(l), fr);
    else
      kernels::decode_accumulate_encode<Codec, Fb>(frames, stride, num_frames, n, out_frame, key,
                                                   index0, fb, nullptr, stream(l), fr);
  }

  /// Writes nothing unless every header of `check` agrees.
  template <class Codec, class U>
  void reduce(lane l, const std::byte* frames, std::size_t stride, int num_frames, std::size_t n,
              U* out, float scale, float* /*acc*/, const header_set& check) {
    kernels::decode_accumulate<Codec, U>(frames, stride, num_frames, n, out, scale, stream(l),
                                         device_check(check));
  }

  /// Writes nothing unless every header of `check` agrees (delta is then unwritten).
  template <class U>
  void accumulate_output(lane l, const float* delta, std::size_t n, float* g, U* out,
                         const header_set& check) {
    if (n == 0) return;
    const std::size_t threads = 256, blocks = (n + threads - 1) / threads;
    accumulate_output_kernel<U>
        <<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), static_cast<unsigned>(threads),
           0, stream(l)>>>(delta, n, g, out, device_check(check));
    LOWBIT_CHECK_LAUNCH();
  }

  void alltoallv(lane l, const std::byte* send, const std::size_t* send_bytes,
                 const std::size_t* send_off, std::byte* recv, const std::size_t* recv_bytes,
                 const std::size_t* recv_off, call_check&) {
    mover_.alltoallv(send, send_bytes, send_off, recv, recv_bytes, recv_off, stream(l));
  }

  /// In place: P slots of slot_bytes at `offset` of buf; slot `rank` is this rank's;
  /// the frames hold `bits`-bit codes.
  void allgather(lane l, const transfer_buffer& buf, std::size_t offset, std::size_t slot_bytes,
                 int bits, call_check&) {
    mover_.allgather(buf, offset, slot_bytes, bits, overlap_, stream(l));
  }

  // ---- plain NCCL, for calls below the crossover (on the caller's stream) ------------
  static ncclRedOp_t nccl_op(reduce_op op) { return op == reduce_op::avg ? ncclAvg : ncclSum; }

  template <class T>
  void plain_all_reduce(const T* in, T* out, std::size_t count, reduce_op op, cudaStream_t s) {
    LOWBIT_NCCL_TRY(
        ncclAllReduce(in, out, count, comm::nccl_data_type<T>(), nccl_op(op), comm_->get(), s));
  }
  /// lowbit's block-aligned shards: ncclReduceScatter when they are equal, else one
  /// ncclReduce per owner, grouped (slower than NCCL's own; docs/design.md "Crossover").
  template <class T>
  void plain_reduce_scatter(const T* in, T* out, std::size_t count, std::size_t block, reduce_op op,
                            cudaStream_t s) {
    if (const std::size_t n = schedule::equal_shard(count, block, comm_->size()); n > 0) {
      LOWBIT_NCCL_TRY(
          ncclReduceScatter(in, out, n, comm::nccl_data_type<T>(), nccl_op(op), comm_->get(), s));
      return;
    }
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
  /// in = my shard: ncclAllGather when the shards are equal, else each owner broadcasts
  /// its shard into place, grouped (slower than NCCL's own; docs/design.md "Crossover").
  template <class T>
  void plain_all_gather(const T* in, T* out, std::size_t count, std::size_t block, cudaStream_t s) {
    if (const std::size_t n = schedule::equal_shard(count, block, comm_->size()); n > 0) {
      LOWBIT_NCCL_TRY(ncclAllGather(in, out, n, comm::nccl_data_type<T>(), comm_->get(), s));
      return;
    }
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
  /// The kernels' form of a header set: recorded into this object's mismatch record.
  kernels::header_check device_check(const header_set& h) const {
    return {h.first, h.stride, h.count, h.want, mismatch_.get()};
  }
  cudaEvent_t fork_event() const { return events_[events_.size() - 2].get(); }
  cudaEvent_t join_event() const { return events_[events_.size() - 1].get(); }

  const comm_type* comm_;
  cudaStream_t caller_ = nullptr;
  bool overlap_ = false;
  lowbit::transport::frame_mover mover_;  ///< picks the transport and moves the frames
  unique_stream side_;
  std::vector<unique_event> events_;
  cudaStream_t check_stream_ = nullptr;
  device_buffer<std::byte> small_dev_;  ///< checked mode's fingerprints, on the device
  std::vector<std::byte> small_host_;   ///< ... and on the host
  /// Where this object's kernels record the first frame header that disagreed.
  mapped_host<kernels::header_mismatch> mismatch_;
};

static_assert(check_backend<backend_impl<backend::nccl>>());

}  // namespace lowbit::detail
