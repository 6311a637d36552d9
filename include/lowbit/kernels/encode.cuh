// Fused encode on the device: x (+ feedback state) -> frame, one pass over memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "lowbit/codec/codec.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/numeric.hpp"
#include "lowbit/feedback/refs.hpp"
#include "lowbit/kernels/detail/group_encoder.cuh"
#include "lowbit/kernels/detail/lane_layout.cuh"
#include "lowbit/kernels/detail/launch.cuh"
#include "lowbit/kernels/detail/staged_feedback.cuh"
#include "lowbit/kernels/detail/tile_lanes.cuh"
#include "lowbit/kernels/detail/warp_tile.cuh"
#include "lowbit/kernels/frame_check.cuh"
#include "lowbit/kernels/launch_policy.cuh"

namespace lowbit::kernels {
namespace detail {

/// Loads a lane's group of values of T as floats through the warp's staging area: the
/// coalesced vector path for a full, 16-byte aligned tile, element by element otherwise.
/// Values past `valid` are 0.
template <class T, class Layout>
__device__ __forceinline__ void row_to_values(const typename warp_tile<T, Layout>::row& r,
                                              int valid, float (&c)[32]) {
  LOWBIT_UNROLL
  for (int i = 0; i < 32; ++i) c[i] = to_float(raw_bits<T>::get(r.w, i));
  if (valid < 32) {
    LOWBIT_UNROLL
    for (int i = 0; i < 32; ++i)
      if (i >= valid) c[i] = 0.0f;
  }
}

/// With `lane_amax` (bf16 inputs), also the lane's max |x| for block_statistics: taken on
/// the packed pairs (lane_abs_max_bf16) when all 32 values are valid.
template <class T, class Layout>
__device__ __forceinline__ void load_group_values(const T* tile, std::size_t tile_n, bool vector,
                                                  unsigned char* s, int lane, int valid,
                                                  float (&c)[32], float* lane_amax = nullptr) {
  using tile_t = warp_tile<T, Layout>;
  typename tile_t::row r;
  if (vector) {
    typename tile_t::striped v;
    tile_t::load_ro(tile, lane, v);
    tile_t::transpose_in(s, lane, v, r);
  } else {
    tile_t::load_scalar(tile, tile_n, s, lane, r);
  }
  row_to_values<T, Layout>(r, valid, c);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (lane_amax != nullptr) *lane_amax = valid == 32 ? lane_abs_max_bf16(r.w) : lane_abs_max(c);
  }
}

/// Whether encode_kernel hands encode_group a lane maximum taken on the packed input
/// (lane_abs_max_bf16): bf16 inputs, a symmetric quantizer, no feedback changing the values.
template <class Codec, class T, class Feedback>
inline constexpr bool packed_lane_max =
    std::is_same_v<T, __nv_bfloat16>&& quant::is_symmetric_v<typename Codec::quantizer_type> &&
    !Feedback::active;

/// The lane's feedback state in registers, staged in and out of a state array.
template <class R, class Layout>
struct state_rows {
  using tile_t = warp_tile<R, Layout>;
  R v[32];

  __device__ __forceinline__ void load(R* tile, std::size_t tile_n, bool vector, unsigned char* s,
                                       int lane) {
    typename tile_t::row r;
    if (vector) {
      typename tile_t::striped sv;
      tile_t::load_rw(tile, lane, sv);
      tile_t::transpose_in(s, lane, sv, r);
    } else {
      tile_t::load_scalar(tile, tile_n, s, lane, r);
    }
    from_row(r);
  }
  /// The second half of a vector load whose global read was issued earlier.
  __device__ __forceinline__ void load_staged(const typename tile_t::striped& sv, unsigned char* s,
                                              int lane) {
    typename tile_t::row r;
    tile_t::transpose_in(s, lane, sv, r);
    from_row(r);
  }
  __device__ __forceinline__ void from_row(const typename tile_t::row& r) {
    LOWBIT_UNROLL
    for (int i = 0; i < 32; ++i) v[i] = raw_bits<R>::get(r.w, i);
  }
  __device__ __forceinline__ void store(R* tile, std::size_t tile_n, bool vector, unsigned char* s,
                                        int lane) const {
    typename tile_t::row r;
    LOWBIT_UNROLL
    for (int i = 0; i < 32; ++i) raw_bits<R>::set(r.w, i, v[i]);
    if (vector) {
      typename tile_t::striped sv;
      tile_t::transpose_out(s, lane, r, sv);
      tile_t::store(tile, lane, sv);
    } else {
      tile_t::store_scalar(tile, tile_n, s, lane, r);
    }
  }
};

/// What the kernels that encode (encode, reduce) derive from Codec, T and Feedback: the
/// lane layout, the staged feedback state and the staging area's element size.
template <class Codec, class T, class Feedback>
struct coding_traits {
  using layout = lane_layout<Codec::groups_per_block>;
  using staged = staged_feedback<Feedback>;
  using state_type = typename staged::state_type;
  static constexpr int staged_size = staged::value && sizeof(state_type) > sizeof(T)
                                         ? static_cast<int>(sizeof(state_type))
                                         : static_cast<int>(sizeof(T));
  static constexpr int warps = launch_policy::max_threads / 32;
};

template <class Codec, class T, class Feedback>
struct encode_traits : coding_traits<Codec, T, Feedback> {
  /// With staged feedback a lane holds its state beside the values and codes: left
  /// alone, ptxas used 145 registers, one 8-warp CTA fit an SM, and the bf16 residual
  /// encode of 2^29 values took 2114 us. Two CTAs per SM cap it at 128 registers (a
  /// 60-byte spill): 1560 us (fp32 residual, 2^28 values: 962 -> 798 us). Three would
  /// cap it at 80 and spill 2.5 KB.
  /// Stochastic rounding of 2-byte inputs runs 4 CTAs of 8 warps an SM (a cap of 64
  /// registers): ptxas' own choice, 68, fits 3, and this pass is bound by instructions and
  /// latency (ncu, bf16 4-bit: DRAM 42% of peak, SM 72%, 35% occupancy), which more warps
  /// hide. The cap cost a spill of 8 bytes (bf16) or 16 (fp16) on sm_90 until the
  /// element-by-element load stopped computing its trip count on every tile's path; absmax<4>
  /// now fits 64 without one. fp32 inputs ran near the copy's rate at 3 CTAs; they are
  /// compiled for at least 3 (at most 80 registers): left free, ptxas took 82 for absmax<4>
  /// (2 CTAs) once the staging addresses became immediates. Under the bound it uses 64 for
  /// absmax<4>, so 4 CTAs fit (not measured yet).
  static constexpr int min_blocks = staged_feedback<Feedback>::value                      ? 2
                                    : Codec::rounding_type::needs_noise && sizeof(T) == 2 ? 4
                                    : Codec::rounding_type::needs_noise                   ? 3
                                                                                          : 1;
};

template <class Codec, class T, class Feedback>
__global__ void __launch_bounds__(launch_policy::max_threads,
                                  encode_traits<Codec, T, Feedback>::min_blocks)
    encode_kernel(const T* __restrict__ x, std::size_t count, codec_extent extent,
                  std::byte* __restrict__ frame, rng_key key, std::uint64_t index0, Feedback fb,
                  bool x_vector, bool state_vector, header_stamp stamp) {
  using traits = encode_traits<Codec, T, Feedback>;
  using layout = typename traits::layout;
  using staged = typename traits::staged;
  using R = typename traits::state_type;
  __shared__ __align__(16) unsigned char smem[traits::warps][staging_bytes(traits::staged_size)];

  const codec_walk<Codec, layout> w(extent);
  const int lane = w.lane;
  unsigned char* s = smem[w.warp];
  if (blockIdx.x == 0 && threadIdx.x == 0)
    zero_meta_padding<typename Codec::meta_type>(frame, w.blocks, w.codes_offset);
  write_stamp(stamp, false);

  for (std::size_t tile = w.first_tile; tile < w.tiles; tile += w.tile_stride) {
    const tile_lanes<layout> t(tile, lane, count, w.blocks);

    float c[32];
    if constexpr (staged::value) {
      state_rows<R, layout> st;
      R* state = staged::state(fb) + t.tile_first;
      if (t.full && x_vector && state_vector) {
        // Both global reads in flight before either transpose waits on one.
        using x_tile = warp_tile<T, layout>;
        typename x_tile::striped xv;
        typename state_rows<R, layout>::tile_t::striped sv;
        x_tile::load_ro(x + t.tile_first, lane, xv);
        state_rows<R, layout>::tile_t::load_rw(state, lane, sv);
        typename x_tile::row r;
        x_tile::transpose_in(s, lane, xv, r);
        row_to_values<T, layout>(r, t.valid, c);
        st.load_staged(sv, s, lane);
      } else {
        load_group_values<T, layout>(x + t.tile_first, t.tile_n, t.full && x_vector, s, lane,
                                     t.valid, c);
        st.load(state, t.tile_n, t.full && state_vector, s, lane);
      }
      encode_group<Codec, layout>(c, t.valid, lane, t.live, t.block, t.group, frame, w.codes_offset,
                                  key, index0 + t.first, staged::bind(st.v));
      st.store(state, t.tile_n, t.full && state_vector, s, lane);
    } else if constexpr (packed_lane_max<Codec, T, Feedback>) {
      float amax;
      load_group_values<T, layout>(x + t.tile_first, t.tile_n, t.full && x_vector, s, lane, t.valid,
                                   c, &amax);
      encode_group<Codec, layout>(c, t.valid, lane, t.live, t.block, t.group, frame, w.codes_offset,
                                  key, index0 + t.first, fb.shifted(t.first), false, &amax);
    } else {
      load_group_values<T, layout>(x + t.tile_first, t.tile_n, t.full && x_vector, s, lane, t.valid,
                                   c);
      encode_group<Codec, layout>(c, t.valid, lane, t.live, t.block, t.group, frame, w.codes_offset,
                                  key, index0 + t.first, fb.shifted(t.first));
    }
  }
}

template <class Codec, class T, class Feedback>
void check_codec_types() {
  static_assert(is_codec_v<Codec>, "lowbit::kernels: Codec must be a lowbit::codec<...>");
  static_assert(is_element_type_v<T>,
                "lowbit::kernels: the element type must be float, __half or __nv_bfloat16");
  static_assert(feedback::is_feedback_ref_v<Feedback>,
                "lowbit::kernels: fb must be a feedback ref (lowbit/feedback/refs.hpp)");
}

}  // namespace detail

/// Encodes `count` values of x (device memory) into `frame` (Codec::frame_bytes(count)
/// bytes of device memory, 16-byte aligned), on `stream`: the device twin of
/// lowbit::host::encode, and byte for byte the same frame.
///
/// `index0` is the tensor index of x[0] (a multiple of 32; it keys stochastic rounding).
/// `fb` is a feedback ref indexed from x[0] whose state lives in device memory; a block
/// holding inf/nan leaves it untouched and decodes to nan. No allocation and no host
/// synchronisation; count 0 launches nothing but the stamp. `stamp`, when its `at` is not
/// null, is written there (the frame's header, frame_check.cuh) by the same kernel. Throws
/// lowbit::invalid_argument before launching when an argument is wrong.
template <class Codec, class T, class Feedback = feedback::none_ref>
void encode(const T* x, std::size_t count, std::byte* frame, const rng_key& key,
            std::uint64_t index0, Feedback fb, cudaStream_t stream, const launch_policy& policy,
            const header_stamp& stamp = {}) {
  detail::check_codec_types<Codec, T, Feedback>();
  LOWBIT_EXPECTS(count == 0 || x != nullptr, "kernels::encode: x is null but count is nonzero");
  detail::check_frame_pointer(frame, count, "kernels::encode");
  detail::check_index0(index0, "kernels::encode");
  using staged = detail::staged_feedback<Feedback>;
  bool state_vector = true;
  if constexpr (staged::value) {
    LOWBIT_EXPECTS(count == 0 || staged::state(fb) != nullptr,
                   "kernels::encode: the feedback state is null but count is nonzero");
    state_vector = detail::aligned16(staged::state(fb));
  }
  if (count == 0) return stamp_header({{}, stamp}, stream);
  detail::check_framing({{}, stamp}, "kernels::encode");
  using layout = typename detail::encode_traits<Codec, T, Feedback>::layout;
  const detail::codec_extent extent = detail::make_codec_extent<Codec, layout>(count);
  detail::encode_kernel<Codec, T, Feedback>
      <<<detail::grid_size(policy, extent.tiles), policy.threads_per_block, 0, stream>>>(
          x, count, extent, frame, key, index0, fb, detail::aligned16(x), state_vector, stamp);
  LOWBIT_CHECK_LAUNCH();
}

/// encode with the launch policy of the current device.
template <class Codec, class T, class Feedback = feedback::none_ref>
void encode(const T* x, std::size_t count, std::byte* frame, const rng_key& key,
            std::uint64_t index0, Feedback fb, cudaStream_t stream,
            const header_stamp& stamp = {}) {
  encode<Codec, T, Feedback>(x, count, frame, key, index0, fb, stream,
                             detail::default_policy(pass::encode), stamp);
}

}  // namespace lowbit::kernels
