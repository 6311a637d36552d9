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
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "lowbit/collective/detail/device_buffer.cuh"
#include "lowbit/collective/detail/engine.hpp"
#include "lowbit/collective/detail/frame_header.hpp"
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
  /// Frames carry no header on the device yet: the ranks' agreement is checked by checked
  /// mode (allgather_small), and a hang on mismatched sizes ends at sync()'s deadline.
  static constexpr std::size_t header_bytes = 0;

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
  /// frame_transport::automatic's choice for all-gathers below copy_engine_min_bytes():
  /// peer stores for codes this wide. Their frames make the transfer the bottleneck, where
  /// the peer-store kernel's speed pays for the SMs it takes: bf16 8-bit all_reduce
  /// 1.56-1.61x NCCL at 256 MiB-1 GiB against 1.39-1.44x for NCCL on the same windows; at
  /// 4 bits the codec was the bottleneck and NCCL's transfer, lighter on the SMs, won.
  static constexpr int peer_store_min_bits = 8;
  /// frame_transport::automatic's choice: in a pipelined call, all-gathers of slots this
  /// large run on the copy engines (where NCCL has CTA policies), smaller ones as above. A
  /// copy-engine transfer starts later than a kernel (19.5 against 12.3 us for 1 MiB per
  /// rank) but takes no SM: bf16 4-bit all_reduce at 256 MiB (slots of 12-24 MB) 2.61x
  /// NCCL against 2.40x, at 64 MiB (slots of 9 MB) 1.82x against 1.98x with every slot on
  /// the copy engines (docs/performance.md). LOWBIT_COPY_ENGINE_MIN_BYTES overrides it (a
  /// tuning knob, the same on every rank).
  static std::size_t copy_engine_min_bytes() {
    const char* env = std::getenv("LOWBIT_COPY_ENGINE_MIN_BYTES");
    return env != nullptr ? std::strtoull(env, nullptr, 10) : (std::size_t{10} << 20);
  }
  /// The same against a faster transfer, peer stores (8-bit codes), or where nothing
  /// overlaps the transfer (a one-chunk call): the copy engines win on speed alone only
  /// from here (64 MiB per rank: 382 against 323 and 338 GB/s; 16 MiB: 264 against 282
  /// and 294). bf16 8-bit all_reduce at 64 MiB: 1.36x NCCL with copy engines, 1.40x with
  /// peer stores; at 128 MiB 1.54x against 1.51x.
  static constexpr std::size_t copy_engine_min_bytes_alone = std::size_t{32} << 20;
  /// Chooses how frames move, before any make_transfer_buffer, for codes of at most
  /// `widest_bits` bits. Collective over the communicator unless `t` is
  /// frame_transport::nccl (window registration, device-communicator creation, and the
  /// communicator's split and peer probe the first time a collective on it asks).
  void set_transport(frame_transport t, int widest_bits) {
    symmetric_ = LOWBIT_HAS_NCCL_WINDOWS && t != frame_transport::nccl && comm_->size() > 1;
    if (!symmetric_) return;
    min_store_bits_ = t == frame_transport::peer_stores ? 0 : peer_store_min_bits;
    // A device communicator only where some all-gather would store to the peers.
    const bool stores = (t == frame_transport::peer_stores || t == frame_transport::automatic) &&
                        widest_bits >= min_store_bits_;
    if (stores) lsa_ = lsa_transport(comm_->get(), comm_);
    // automatic: copy engines only where the peers' memory is mapped (NVLink or PCIe P2P);
    // without it NCCL has no copy-engine path. The communicator answers that once, from
    // whether a device communicator could be made (lsa_ when this object made one), and
    // the split is the communicator's too: the next collectives on it pay for neither.
    const auto mapped = [&] {
      return comm_->peers_mapped(
          [&](ncclComm_t c) { return stores ? lsa_.enabled() : lsa_transport(c).enabled(); });
    };
    if (t == frame_transport::copy_engines || (t == frame_transport::automatic && mapped())) {
      ce_ = comm_->zero_cta_split();
      const bool always = t == frame_transport::copy_engines;
      ce_min_bytes_ = always ? 0 : copy_engine_min_bytes();
      ce_min_alone_bytes_ = always ? 0 : copy_engine_min_bytes_alone;
    }
  }
  /// The transport of the largest all-gathers of the widest codes: copy_engines only where
  /// NCCL has CTA policies, peer_stores only where every peer is load/store accessible.
  frame_transport transport() const noexcept {
    return ce_ != nullptr   ? frame_transport::copy_engines
           : lsa_.enabled() ? frame_transport::peer_stores
           : symmetric_     ? frame_transport::nccl_symmetric
                            : frame_transport::nccl;
  }
  /// Collective over the communicator with a symmetric transport (window registration,
  /// with the zero-CTA split too when there is one).
  transfer_buffer make_transfer_buffer(std::size_t bytes) const {
    return window_buffer(comm_->get(), bytes, symmetric_, ce_, comm_);
  }
  static void check_sizes(std::size_t, std::size_t, std::size_t) {}
  void check_alive(const char* who) const { comm_->check(who); }

  /// out = in on the stream (a one-rank call); nothing when they alias exactly.
  template <class U>
  void copy(const U* in, U* out, std::size_t n, cudaStream_t stream) {
    if (in != out && n > 0)
      LOWBIT_CUDA_TRY(cudaMemcpyAsync(out, in, n * sizeof(U), cudaMemcpyDeviceToDevice, stream));
  }
  void stamp(lane, std::byte*, const frame_header&) {}

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
    LOWBIT_NCCL_TRY(ncclAllGather(mine_dev, small_dev_.data(), bytes, ncclUint8, comm_->get(),
                                  check_stream_));
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
                 const std::size_t* recv_off, call_check&) {
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
                 int bits, call_check&) {
    if (comm_->size() == 1) return;
    const bool stores = lsa_.enabled() && buf.symmetric() && bits >= min_store_bits_;
    const bool engines = ce_ != nullptr && buf.symmetric() &&
                         slot_bytes >= (overlap_ && !stores ? ce_min_bytes_ : ce_min_alone_bytes_);
    if (stores && !engines) return lsa_.allgather(buf, offset, slot_bytes, stream(l));
    std::byte* base = buf.data() + offset;
    LOWBIT_NCCL_TRY(ncclAllGather(base + static_cast<std::size_t>(comm_->rank()) * slot_bytes, base,
                                  slot_bytes, ncclUint8, engines ? ce_ : comm_->get(), stream(l)));
  }

  // ---- plain NCCL, for calls below the crossover (on the caller's stream) ------------
  static ncclRedOp_t nccl_op(reduce_op op) { return op == reduce_op::avg ? ncclAvg : ncclSum; }

  template <class T>
  void plain_all_reduce(const T* in, T* out, std::size_t count, reduce_op op, cudaStream_t s) {
    LOWBIT_NCCL_TRY(
        ncclAllReduce(in, out, count, comm::nccl_data_type<T>(), nccl_op(op), comm_->get(), s));
  }
  /// lowbit's block-aligned shards: ncclReduceScatter when they are equal, else one
  /// ncclReduce per owner, grouped (0.67x NCCL's reduce_scatter for bf16 at 2 MiB).
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
  /// its shard into place, grouped (0.68x NCCL's all_gather for bf16 at 2 MiB).
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
  cudaEvent_t fork_event() const { return events_[events_.size() - 2].get(); }
  cudaEvent_t join_event() const { return events_[events_.size() - 1].get(); }

  const comm_type* comm_;
  cudaStream_t caller_ = nullptr;
  bool overlap_ = false;
  bool symmetric_ = false;                    ///< transfer buffers are symmetric NCCL windows
  int min_store_bits_ = peer_store_min_bits;  ///< peer stores for codes at least this wide
  lsa_transport lsa_;                         ///< enabled: such all-gathers are peer stores
  ncclComm_t ce_ = nullptr;             ///< non-null: large all-gathers go to this zero-CTA split
  std::size_t ce_min_bytes_ = 0;        ///< ... in a pipelined call, against NCCL kernels
  std::size_t ce_min_alone_bytes_ = 0;  ///< ... against peer stores or in a one-chunk call
  unique_stream side_;
  std::vector<unique_event> events_;
  cudaStream_t check_stream_ = nullptr;
  device_buffer<std::byte> small_dev_;  ///< checked mode's fingerprints, on the device
  std::vector<std::byte> small_host_;   ///< ... and on the host
};

}  // namespace lowbit::detail
