// Decode on the device: frame -> T, optionally scaled (1/P for avg).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "lowbit/codec/codec.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/float_ops.hpp"
#include "lowbit/core/numeric.hpp"
#include "lowbit/kernels/detail/frame_io.cuh"
#include "lowbit/kernels/detail/group_decoder.cuh"
#include "lowbit/kernels/detail/lane_layout.cuh"
#include "lowbit/kernels/detail/launch.cuh"
#include "lowbit/kernels/detail/tile_lanes.cuh"
#include "lowbit/kernels/detail/warp_tile.cuh"
#include "lowbit/kernels/frame_check.cuh"
#include "lowbit/kernels/launch_policy.cuh"

namespace lowbit::kernels {
namespace detail {

/// Writes a lane's 32 output values through the warp's staging area: coalesced vectors
/// for a full, 16-byte aligned tile, element by element otherwise.
template <class T, class Layout>
__device__ __forceinline__ void store_group_values(T* tile, std::size_t tile_n, bool vector,
                                                   unsigned char* s, int lane,
                                                   const typename warp_tile<T, Layout>::row& r) {
  using tile_t = warp_tile<T, Layout>;
  if (vector) {
    typename tile_t::striped v;
    tile_t::transpose_out(s, lane, r, v);
    tile_t::store(tile, lane, v);
  } else {
    tile_t::store_scalar(tile, tile_n, s, lane, r);
  }
}

/// One group's packed codes and its block's meta, as loaded from a frame.
template <class Codec>
struct packed_group {
  std::uint32_t words[Codec::bits];
  typename Codec::meta_type meta;

  /// Loads the group's words and its meta from where they lie in a frame.
  __device__ __forceinline__ void load_from(const std::byte* words_at, const std::byte* meta_at) {
    load_words<Codec::bits>(words_at, words);
    meta = *reinterpret_cast<const typename Codec::meta_type*>(meta_at);
  }
  /// load_from, with the group's byte offsets in `frame` (its words', its meta's).
  __device__ __forceinline__ void load_at(const std::byte* frame, std::size_t words_at,
                                          std::size_t meta_at) {
    load_from(frame + words_at, frame + meta_at);
  }
  /// The group's values in fp32, as the host decodes them (Quantizer::dequantize per code).
  __device__ __forceinline__ void decode(float (&y)[32]) const {
    for_each_value<Codec>(words, meta, [&](int i, float v) { y[i] = v; });
  }
  /// y[i] = 0.0f + value i, in fp32: a sum's first frame, as the host's acc = 0 followed by
  /// its decode_accumulate step (start_sum: no add a value where the step allows).
  __device__ __forceinline__ void start(float (&y)[32]) const { start_sum<Codec>(words, meta, y); }
  /// y[i] += value i, in fp32 (the host's decode_accumulate step).
  __device__ __forceinline__ void accumulate(float (&y)[32]) const {
    for_each_value<Codec>(words, meta,
                          [&](int i, float v) { y[i] = lowbit::detail::fadd(y[i], v); });
  }
};

/// CTAs per SM the decode kernel is compiled for. With 2-byte outputs ptxas used 79 (bf16)
/// and 95 (fp16) registers, so 3 and 2 of the policy's 4 CTAs fit an SM; capped at 64 they
/// all fit, spill-free: 2^29 values from bf16 frames, decode 421 -> 361 us, decode-sum of
/// 2 frames 632 -> 482 us. With fp32 outputs a cap of 64 spills and the sum slowed (398 ->
/// 434 us for 2^28 values). fp32 outputs are held to 3 CTAs (80 registers): left free ptxas
/// takes 96 at 1, 2 and 4 bits, 2 CTAs of 8 warps an SM, and the one-shot reduce of 4 and 8
/// frames, bound by the latency of its loads (ncu: warps waiting on global loads), had 16
/// warps an SM to keep them in flight; at 80 it has 24 (ncu on one H100: 22), and its fp32
/// 4-bit ratio to a copy went 0.870 -> 0.944 (4 frames) and 0.815 -> 0.906 (8) against the
/// same kernel left free (docs/results/2026-12-06-codec-ab-one-h100.md).
template <class T>
inline constexpr int decode_min_blocks = sizeof(T) == 2 ? 4 : 3;

/// Decodes a frame, or (sum) the fp32 sum of `num_frames` frames `frame_stride` bytes
/// apart, from 0.0f in frame order as the host's decode_accumulate does; then scales.
template <class Codec, class T>
__global__ void __launch_bounds__(launch_policy::max_threads, decode_min_blocks<T>)
    decode_kernel(const std::byte* __restrict__ frame, std::size_t frame_stride, int num_frames,
                  bool sum, std::size_t count, T* __restrict__ out, float scale, bool out_vector,
                  header_check check) {
  using layout = lane_layout<1>;  // decoding needs no block reduction: a lane per group
  using tile_t = warp_tile<T, layout>;
  __shared__ __align__(16) unsigned char smem[launch_policy::max_threads / 32]
                                             [staging_bytes(static_cast<int>(sizeof(T)))];
  const warp_walk w;
  const int lane = w.lane;
  unsigned char* s = smem[w.warp];
  // A block of this layout is one packing group. (Counting tiles from the groups, or
  // testing t.live below, is the same and compiles a few instructions longer.)
  const std::size_t groups = (count + 31) / 32;
  const std::size_t tiles = (count + layout::values_per_warp - 1) / layout::values_per_warp;
  const std::size_t codes_offset = Codec::codes_offset(count);
  // Judged before the warp's first store: a stranger's frame leaves the output untouched.
  // Per warp, not once per CTA (cta_header_probe): decode has little to do before its
  // first store, and its warps waiting for warp 0's verdict measured slower (decode_hdr,
  // fp32 4-bit 256 MiB on one H200: 0.745 of a copy per CTA, 0.855 per warp;
  // docs/results/2026-12-03-codec-one-h200.md).
  const header_probe probe(check);

  for (std::size_t tile = w.first_tile; tile < tiles; tile += w.tile_stride) {
    const tile_lanes<layout> t(tile, lane, count, groups);
    typename tile_t::row r;
    if (t.first < count) {
      // Up to 4 bits, frame p + 1's group is loaded before frame p's is decoded, so a lane
      // keeps a load in flight while it computes: 2^29 values from two bf16 4-bit frames,
      // 486 -> 470 us. Wider codes would spill under the 2-byte outputs' register cap (36
      // bytes at 8 bits), so they load each frame as they decode it.
      constexpr bool prefetch = Codec::bits <= 4;
      // The group's offsets in a frame, once a tile; a frame's address is one add from the
      // last (recomputing both from the frame's base, a frame took ~20 more instructions).
      const std::byte* words = frame + codes_offset + t.group * Codec::group_bytes;
      const std::byte* meta =
          frame + t.group / Codec::groups_per_block * sizeof(typename Codec::meta_type);
      packed_group<Codec> cur;
      cur.load_from(words, meta);
      float y[32];
      if (sum && num_frames > 1) {
        packed_group<Codec> next;
        words += frame_stride;  // frame 1
        meta += frame_stride;
        if constexpr (prefetch) next.load_from(words, meta);
        cur.start(y);
        if constexpr (prefetch) {
          // Frames in pairs, next holding the odd ones and cur the even: each is reloaded
          // with the frame two ahead as soon as it is summed, with no copy between them.
          for (int p = 1; p < num_frames; p += 2) {
            words += frame_stride;  // frame p + 1
            meta += frame_stride;
            if (p + 1 < num_frames) cur.load_from(words, meta);
            next.accumulate(y);  // frame p
            if (p + 1 >= num_frames) break;
            words += frame_stride;  // frame p + 2
            meta += frame_stride;
            if (p + 2 < num_frames) next.load_from(words, meta);
            cur.accumulate(y);  // frame p + 1
          }
        } else {
          for (int p = 1; p < num_frames; ++p) {
            cur.load_from(words, meta);  // frame p
            words += frame_stride;
            meta += frame_stride;
            cur.accumulate(y);
          }
        }
      } else {
        if (sum) {
          cur.start(y);
        } else {
          cur.decode(y);
        }
      }
      LOWBIT_UNROLL
      for (int i = 0; i < 32; ++i) {
        float v = y[i];
        if (scale != 1.0f) v = lowbit::detail::fmul(v, scale);
        raw_bits<T>::set(r.w, i, from_float<T>(v));
      }
    }
    if (tile == w.first_tile && !probe.agree(check)) return;
    store_group_values<T, layout>(out + t.tile_first, t.tile_n, out_vector && t.full, s, lane, r);
  }
}

}  // namespace detail

/// Decodes a frame of `count` values (device memory, 16-byte aligned) into out (device
/// memory), each multiplied by `scale` unless it is 1: the device twin of
/// lowbit::host::decode, with the same bits. count 0 launches nothing. With a `check`
/// (frame_check.cuh), nothing is written unless every header it names agrees.
template <class Codec, class T>
void decode(const std::byte* frame, std::size_t count, T* out, float scale, cudaStream_t stream,
            const launch_policy& policy, const header_check& check = {}) {
  static_assert(is_codec_v<Codec>, "lowbit::kernels::decode: Codec must be a lowbit::codec<...>");
  static_assert(is_element_type_v<T>,
                "lowbit::kernels::decode: the element type must be float, __half or __nv_bfloat16");
  LOWBIT_EXPECTS(count == 0 || out != nullptr, "kernels::decode: out is null but count is nonzero");
  detail::check_frame_pointer(frame, count, "kernels::decode");
  detail::check_framing({check, {}}, "kernels::decode");
  if (count == 0) return;
  const std::size_t tiles = (count + 1023) / 1024;
  detail::decode_kernel<Codec, T>
      <<<detail::grid_size(policy, tiles), policy.threads_per_block, 0, stream>>>(
          frame, 0, 1, false, count, out, scale, detail::aligned16(out), check);
  LOWBIT_CHECK_LAUNCH();
}

/// decode with the launch policy of the current device.
template <class Codec, class T>
void decode(const std::byte* frame, std::size_t count, T* out, float scale, cudaStream_t stream,
            const header_check& check = {}) {
  decode<Codec, T>(frame, count, out, scale, stream, detail::default_policy(pass::decode), check);
}

}  // namespace lowbit::kernels
