// The middle of all_reduce in one kernel: decode the P frames of a shard, sum them in
// fp32 (frame order, from 0.0f, as the host does), apply the optional second-stage
// feedback, and encode the sum into one frame; optionally also write, as T, either the
// sum or the decoded value of the frame just written (all_reduce's own shard, which then
// needs no separate decode pass).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "lowbit/codec/codec.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/float_ops.hpp"
#include "lowbit/core/numeric.hpp"
#include "lowbit/feedback/refs.hpp"
#include "lowbit/kernels/decode.cuh"
#include "lowbit/kernels/detail/group_encoder.cuh"
#include "lowbit/kernels/detail/lane_layout.cuh"
#include "lowbit/kernels/detail/launch.cuh"
#include "lowbit/kernels/detail/staged_feedback.cuh"
#include "lowbit/kernels/detail/tile_lanes.cuh"
#include "lowbit/kernels/detail/warp_tile.cuh"
#include "lowbit/kernels/encode.cuh"
#include "lowbit/kernels/frame_check.cuh"
#include "lowbit/kernels/launch_policy.cuh"

namespace lowbit::kernels {
namespace detail {

/// The registers a thread of reduce_kernel<Codec, T, Feedback> may use. The sum is bound
/// by its instructions with 4-warp CTAs (docs/design.md, "The codec kernels"), so more
/// warps an SM issue more often: 96 registers give 5 CTAs an SM where 128 gave 4, and
/// ptxas (sm_90, nvcc 13) fits every instantiation without a second-stage state in 96
/// without a spill, but 8-bit stochastic rounding (8-16 bytes). A second-stage residual
/// spills 250-640 bytes at 96, so it and 8-bit stochastic rounding keep 128: two CTAs of
/// launch_policy::max_threads (left alone, ptxas gave the 8-bit sum with an fp32
/// residual 137 registers, one CTA of 8 warps an SM).
template <class Codec, class Feedback>
constexpr int reduce_max_registers() {
  constexpr bool stochastic8 =
      Codec::bits > 4 && std::is_same_v<typename Codec::rounding_type, lowbit::round::stochastic>;
  return staged_feedback<Feedback>::value || stochastic8 ? 128 : 96;
}
static_assert(96 * launch_policy::max_threads <= 65536 && 128 * launch_policy::max_threads <= 65536,
              "a CTA of launch_policy::max_threads must fit an SM's 64 Ki registers");

// __maxnreg__ came with CUDA 12.4; an older nvcc compiles every instantiation for two
// CTAs of launch_policy::max_threads (128 registers), as before the cap of 96.
#if defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4))
#define LOWBIT_REDUCE_REGISTERS(Codec, Feedback) \
  __maxnreg__((reduce_max_registers<Codec, Feedback>()))
#else
#define LOWBIT_REDUCE_REGISTERS(Codec, Feedback) __launch_bounds__(launch_policy::max_threads, 2)
#endif

template <class Codec, class T, class Feedback>
__global__ void LOWBIT_REDUCE_REGISTERS(Codec, Feedback)
    reduce_kernel(const std::byte* __restrict__ frames, std::size_t frame_stride, int num_frames,
                  std::size_t count, std::byte* __restrict__ out_frame, rng_key key,
                  std::uint64_t index0, Feedback fb, T* __restrict__ reduced_out,
                  float reduced_scale, bool requantized_out, bool out_vector, bool state_vector,
                  framing fr) {
  using traits = coding_traits<Codec, T, Feedback>;
  using layout = typename traits::layout;
  using staged = typename traits::staged;
  using R = typename traits::state_type;
  using tile_t = warp_tile<T, layout>;
  using meta_type = typename Codec::meta_type;
  __shared__ __align__(16) unsigned char smem[traits::warps][staging_bytes(traits::staged_size)];

  const codec_walk<Codec, layout> w(count);
  const int lane = w.lane;
  unsigned char* s = smem[w.warp];
  // Nothing is written before the headers are judged (once per CTA, by warp 0; the other
  // warps take its verdict in their first tile): frames that disagree yield a poisoned
  // header and no data. Warp 0 of every CTA has a tile (count > 0), so warp 0 of CTA 0
  // writes the output's header and the meta padding.
  __shared__ unsigned verdict;
  const cta_header_probe probe(fr.check, &verdict);
  const auto verify = [&] {
    const bool agree = probe.agree(fr.check);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      write_stamp(fr.stamp, !agree);
      if (agree && out_frame != nullptr)
        zero_meta_padding<meta_type>(out_frame, w.blocks, w.codes_offset);
    }
    return agree;
  };

  for (std::size_t tile = w.first_tile; tile < w.tiles; tile += w.tile_stride) {
    const tile_lanes<layout> t(tile, lane, count, w.blocks);

    float c[32];
    if (t.live) {
      // Frame p + 1's group is loaded before frame p's is decoded (up to 8 bits: wider
      // codes would spill under the register cap), so a lane keeps two loads in
      // flight: with one, a CTA of 4 warps has 2 KiB of 4-bit codes in flight, and the
      // frames' reads wait on latency, not bandwidth.
      constexpr bool prefetch = Codec::bits <= 8;
      // The group's offsets in a frame, once a tile; a frame is then a pointer bump away.
      const std::size_t words_at = w.codes_offset + t.group * Codec::group_bytes;
      const std::size_t meta_at = t.block * sizeof(meta_type);
      if constexpr (prefetch) {
        // Two groups, one for the even frames and one for the odd, each reloaded with the
        // frame two ahead as soon as it is summed: the same two loads in flight as a
        // current/next pair, without copying next into current (five moves a frame) and
        // with the frame's address one 64-bit add from the last. Frame 0 starts the sum
        // (packed_group::start: c = 0 + its values, without the adds where the step
        // allows), so c needs no zeroing.
        packed_group<Codec> even, odd;
        const std::size_t stride2 = 2 * frame_stride;
        const std::byte* even_at = frames;
        const std::byte* odd_at = frames + frame_stride;
        even.load_at(even_at, words_at, meta_at);
        if (num_frames > 1) odd.load_at(odd_at, words_at, meta_at);
        even.start(c);
        if (num_frames > 2) {
          even_at += stride2;
          even.load_at(even_at, words_at, meta_at);
        }
        for (int p = 1; p < num_frames; p += 2) {
          odd.accumulate(c);
          if (p + 2 < num_frames) {
            odd_at += stride2;
            odd.load_at(odd_at, words_at, meta_at);
          }
          if (p + 1 < num_frames) {
            even.accumulate(c);
            if (p + 3 < num_frames) {
              even_at += stride2;
              even.load_at(even_at, words_at, meta_at);
            }
          }
        }
      } else {
        packed_group<Codec> cur;
        const std::byte* f = frames;
        cur.load_at(f, words_at, meta_at);
        cur.start(c);
        for (int p = 1; p < num_frames; ++p) {
          f += frame_stride;
          cur.load_at(f, words_at, meta_at);
          cur.accumulate(c);
        }
      }
    }
    // The values past the end are 0 (a lane that is not live has valid 0): zeroed here
    // alone, not all 32 before the sum, which its first frame now writes.
    if (t.valid < 32) {
      LOWBIT_UNROLL
      for (int i = 0; i < 32; ++i)
        if (i >= t.valid) c[i] = 0.0f;
    }

    if (tile == w.first_tile && !verify()) return;

    // The T output: the sum now, or (requantized_out) what encode_group decodes back.
    const auto write_out = [&] {
      typename tile_t::row r;
      LOWBIT_UNROLL
      for (int i = 0; i < 32; ++i) {
        float v = c[i];
        if (reduced_scale != 1.0f) v = lowbit::detail::fmul(v, reduced_scale);
        raw_bits<T>::set(r.w, i, from_float<T>(v));
      }
      store_group_values<T, layout>(reduced_out + t.tile_first, t.tile_n, t.full && out_vector, s,
                                    lane, r);
    };
    if (reduced_out != nullptr && !requantized_out) write_out();

    if (out_frame != nullptr) {
      if constexpr (staged::value) {
        state_rows<R, layout> st;
        R* state = staged::state(fb) + t.tile_first;
        st.load(state, t.tile_n, t.full && state_vector, s, lane);
        encode_group<Codec, layout>(c, t.valid, lane, t.live, t.block, t.group, out_frame,
                                    w.codes_offset, key, index0 + t.first, staged::bind(st.v),
                                    requantized_out);
        st.store(state, t.tile_n, t.full && state_vector, s, lane);
      } else {
        encode_group<Codec, layout>(c, t.valid, lane, t.live, t.block, t.group, out_frame,
                                    w.codes_offset, key, index0 + t.first, fb.shifted(t.first),
                                    requantized_out);
      }
      if (reduced_out != nullptr && requantized_out) write_out();
    }
  }
}

#undef LOWBIT_REDUCE_REGISTERS

template <class Codec, class Feedback, class T>
void launch_reduce(const std::byte* frames, std::size_t frame_stride, int num_frames,
                   std::size_t count, std::byte* out_frame, const rng_key& key,
                   std::uint64_t index0, Feedback fb, T* reduced_out, float reduced_scale,
                   bool requantized_out, cudaStream_t stream, const launch_policy& policy,
                   const char* what, const framing& fr) {
  check_codec_types<Codec, T, Feedback>();
  const std::string w(what);
  LOWBIT_EXPECTS(num_frames >= 1, w + ": num_frames must be >= 1");
  LOWBIT_EXPECTS(frame_stride >= Codec::frame_bytes(count) && frame_stride % 16 == 0,
                 w + ": frame_stride must hold a frame and be a multiple of 16");
  check_frame_pointer(frames, count, what);
  LOWBIT_EXPECTS(aligned16(out_frame), w + ": out_frame must be 16-byte aligned");
  LOWBIT_EXPECTS(count == 0 || out_frame != nullptr || reduced_out != nullptr,
                 w + ": out_frame and reduced_out are both null");
  LOWBIT_EXPECTS(!requantized_out || count == 0 || (out_frame != nullptr && reduced_out != nullptr),
                 w + ": the decoded re-encoded values need both out_frame and decoded_out");
  check_index0(index0, what);
  using staged = staged_feedback<Feedback>;
  bool state_vector = true;
  if constexpr (staged::value) {
    LOWBIT_EXPECTS(count == 0 || out_frame == nullptr || staged::state(fb) != nullptr,
                   w + ": the feedback state is null but count is nonzero");
    state_vector = aligned16(staged::state(fb));
  }
  check_framing(fr, what);
  if (count == 0) return stamp_header(fr, stream);
  using layout = typename coding_traits<Codec, T, Feedback>::layout;
  const std::size_t tiles = tile_count<layout>(Codec::num_blocks(count));
  reduce_kernel<Codec, T, Feedback>
      <<<grid_size(policy, tiles), policy.threads_per_block, 0, stream>>>(
          frames, frame_stride, num_frames, count, out_frame, key, index0, fb, reduced_out,
          reduced_scale, requantized_out, aligned16(reduced_out), state_vector, fr);
  LOWBIT_CHECK_LAUNCH();
}

}  // namespace detail

/// The middle of all_reduce: sums `num_frames` frames of `count` values (frame p at
/// frames + p * frame_stride, device memory) in fp32, in order p = 0, 1, ..., and
/// encodes the sum into `out_frame` with feedback `fb` (a second-stage residual, or
/// none): the device twin of lowbit::host::decode_accumulate_encode, with the same bytes.
/// `reduced_out`, when not null, receives the fp32 sum (what the host leaves in `acc`)
/// converted to T, multiplied by `reduced_scale` unless it is 1. `out_frame` may be null
/// when only the sum is wanted (reduce_scatter). No allocation, no host sync. `fr`
/// (frame_check.cuh): the input headers to check before anything is written, and the
/// output frame's header, written poisoned (and no data) when a checked header disagrees.
template <class Codec, class Feedback = feedback::none_ref, class T = float>
void decode_accumulate_encode(const std::byte* frames, std::size_t frame_stride, int num_frames,
                              std::size_t count, std::byte* out_frame, const rng_key& key,
                              std::uint64_t index0, Feedback fb, T* reduced_out,
                              float reduced_scale, cudaStream_t stream, const launch_policy& policy,
                              const framing& fr = {}) {
  detail::launch_reduce<Codec>(frames, frame_stride, num_frames, count, out_frame, key, index0, fb,
                               reduced_out, reduced_scale, false, stream, policy,
                               "kernels::decode_accumulate_encode", fr);
}

/// decode_accumulate_encode that also writes `decoded_out[i] = T(scale * v)`, v the value
/// the new frame decodes to: the bits kernels::decode(out_frame, count, decoded_out, scale)
/// would write, without reading the frame back (all_reduce's own shard). Neither pointer
/// may be null when count > 0.
template <class Codec, class Feedback = feedback::none_ref, class T = float>
void decode_accumulate_encode_decode(const std::byte* frames, std::size_t frame_stride,
                                     int num_frames, std::size_t count, std::byte* out_frame,
                                     const rng_key& key, std::uint64_t index0, Feedback fb,
                                     T* decoded_out, float scale, cudaStream_t stream,
                                     const framing& fr = {}) {
  detail::launch_reduce<Codec>(
      frames, frame_stride, num_frames, count, out_frame, key, index0, fb, decoded_out, scale, true,
      stream, detail::default_policy(pass::reduce), "kernels::decode_accumulate_encode_decode", fr);
}

/// decode_accumulate_encode with the sum written unscaled (when reduced_out is not null)
/// and the launch policy of the current device.
template <class Codec, class Feedback = feedback::none_ref, class T = float>
void decode_accumulate_encode(const std::byte* frames, std::size_t frame_stride, int num_frames,
                              std::size_t count, std::byte* out_frame, const rng_key& key,
                              std::uint64_t index0, Feedback fb, T* reduced_out,
                              cudaStream_t stream) {
  decode_accumulate_encode<Codec, Feedback, T>(frames, frame_stride, num_frames, count, out_frame,
                                               key, index0, fb, reduced_out, 1.0f, stream,
                                               detail::default_policy(pass::reduce));
}

/// decode_accumulate_encode without the decoded sum (reduced_out = nullptr).
template <class Codec, class Feedback = feedback::none_ref>
void decode_accumulate_encode(const std::byte* frames, std::size_t frame_stride, int num_frames,
                              std::size_t count, std::byte* out_frame, const rng_key& key,
                              std::uint64_t index0, Feedback fb, std::nullptr_t,
                              cudaStream_t stream, const framing& fr = {}) {
  decode_accumulate_encode<Codec, Feedback, float>(
      frames, frame_stride, num_frames, count, out_frame, key, index0, fb,
      static_cast<float*>(nullptr), 1.0f, stream, detail::default_policy(pass::reduce), fr);
}

/// The reduce_scatter half: out[i] = T(scale * sum over p of frame p's value i), the sum
/// in fp32 in frame order from 0.0f (scale skipped when 1). No frame is written. With a
/// `check` (frame_check.cuh), nothing is written unless every header it names agrees.
template <class Codec, class T>
void decode_accumulate(const std::byte* frames, std::size_t frame_stride, int num_frames,
                       std::size_t count, T* out, float scale, cudaStream_t stream,
                       const header_check& check = {}) {
  static_assert(is_codec_v<Codec>,
                "lowbit::kernels::decode_accumulate: Codec must be a lowbit::codec<...>");
  static_assert(is_element_type_v<T>,
                "lowbit::kernels::decode_accumulate: the element type "
                "must be float, __half or __nv_bfloat16");
  const char* what = "kernels::decode_accumulate";
  LOWBIT_EXPECTS(count == 0 || out != nullptr,
                 "kernels::decode_accumulate: out is null but count is nonzero");
  LOWBIT_EXPECTS(num_frames >= 1, "kernels::decode_accumulate: num_frames must be >= 1");
  LOWBIT_EXPECTS(frame_stride >= Codec::frame_bytes(count) && frame_stride % 16 == 0,
                 "kernels::decode_accumulate: frame_stride must hold a frame and be a multiple "
                 "of 16");
  detail::check_frame_pointer(frames, count, what);
  detail::check_framing({check, {}}, what);
  if (count == 0) return;
  // The decode kernel's layout (a lane per group, no block reduction): the sum needs no
  // statistics, and this pass runs near the decode's bandwidth.
  const launch_policy policy = detail::default_policy(pass::decode);
  const std::size_t tiles = (count + 1023) / 1024;
  detail::decode_kernel<Codec, T>
      <<<detail::grid_size(policy, tiles), policy.threads_per_block, 0, stream>>>(
          frames, frame_stride, num_frames, true, count, out, scale, detail::aligned16(out), check);
  LOWBIT_CHECK_LAUNCH();
}

}  // namespace lowbit::kernels
