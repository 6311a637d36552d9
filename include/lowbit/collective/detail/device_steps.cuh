// What the device backends share (NCCL's and the node backend's): device buffers, the CUDA
// codec kernels, and the two lanes of a call (the caller's stream and a transfer stream,
// linked by events). A device backend derives from device_steps and adds its transfers.
//
// Frame headers are written and checked by the codec kernels themselves
// (kernels/frame_check.cuh): a kernel that consumes frames checks the headers of its call's
// frames before it writes anything and records the first disagreement in mapped host
// memory, which the engine reads at sync() and at the next call.
//
// Lanes: `compute` is the caller's stream; `comm` is an internal non-blocking stream of
// the greatest priority when a call has several chunks (the caller's stream otherwise,
// and always with schedule::flat). Lanes are linked by events only, so a call never waits
// on the host and can be captured in a CUDA graph (the internal stream forks from and
// joins back into the caller's stream).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lowbit/collective/backend.hpp"
#include "lowbit/collective/detail/agreement.hpp"
#include "lowbit/collective/detail/device_buffer.cuh"
#include "lowbit/core/float_ops.hpp"
#include "lowbit/core/numeric.hpp"
#include "lowbit/kernels/frame_check.cuh"
#include "lowbit/kernels/kernels.cuh"

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

/// The codec steps and lanes of a device backend (see the file comment).
class device_steps {
 public:
  using stream_type = cudaStream_t;
  template <class U>
  using buffer = device_buffer<U>;
  /// Calls are enqueued on the caller's stream.
  static constexpr bool stream_ordered = true;
  /// The reduce kernels keep the fp32 sum in registers.
  static constexpr bool needs_sum_scratch = false;
  /// Every frame starts with a frame_header, written by the kernel that writes the frame
  /// and checked by the kernels that read it.
  static constexpr std::size_t header_bytes = sizeof(frame_header);
  /// Frames live in device memory: the host never reads a header.
  static constexpr bool host_frames = false;

  /// `events` event slots for the engine (used when `streams` > 1, with a transfer stream).
  device_steps(int events, int streams)
      : mismatch_(mapped_host<kernels::header_mismatch>::create()) {
    if (streams > 1) {
      // The transfers' stream outranks the codec's: a transfer kernel issued while a codec
      // kernel's grid is still being dispatched would otherwise wait for its last wave,
      // and the pipeline would run serially.
      side_ = unique_stream::create_high_priority();
      events_.reserve(static_cast<std::size_t>(events) + 2);
      for (int i = 0; i < events + 2; ++i) events_.push_back(unique_event::create());
    }
  }

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

  /// The kernels' form of a header set: a disagreement is recorded into this object's
  /// mismatch record (what disagreement() reads).
  kernels::header_check device_check(const header_set& h) const { return {h, mismatch_.get()}; }

 protected:
  cudaStream_t stream(lane l) const { return l == lane::comm && overlap_ ? side_.get() : caller_; }
  cudaEvent_t fork_event() const { return events_[events_.size() - 2].get(); }
  cudaEvent_t join_event() const { return events_[events_.size() - 1].get(); }

  cudaStream_t caller_ = nullptr;
  bool overlap_ = false;
  unique_stream side_;
  std::vector<unique_event> events_;
  /// Where this object's kernels record the first frame header that disagreed.
  mapped_host<kernels::header_mismatch> mismatch_;
};

}  // namespace lowbit::detail
