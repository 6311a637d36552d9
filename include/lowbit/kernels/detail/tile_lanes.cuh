// The prologue the codec kernels share: which tiles a warp takes in the grid-stride loop,
// and for one tile, its extent and the calling lane's block, group and valid values.
#pragma once

#include <cstddef>

#include "lowbit/core/config.hpp"

namespace lowbit::kernels::detail {

/// Tiles of `Layout` needed for `blocks` quantizer blocks (host and device).
template <class Layout>
LOWBIT_HD constexpr std::size_t tile_count(std::size_t blocks) {
  return (blocks + Layout::blocks_per_warp - 1) / Layout::blocks_per_warp;
}

/// A frame's block count, the tiles over them and its code section's offset: what a
/// kernel derives from `count` alone, computed on the host and passed in (a kernel
/// parameter is one constant load where ptxas rebuilt these from count every tile).
struct codec_extent {
  std::size_t blocks;
  std::size_t tiles;
  std::size_t codes_offset;
};
template <class Codec, class Layout>
LOWBIT_HD constexpr codec_extent make_codec_extent(std::size_t count) {
  return {Codec::num_blocks(count), tile_count<Layout>(Codec::num_blocks(count)),
          Codec::codes_offset(count)};
}

#if LOWBIT_CUDA
/// The calling thread's place in the kernels' grid-stride loop over warp tiles:
/// `for (std::size_t tile = w.first_tile; tile < tiles; tile += w.tile_stride)`.
struct warp_walk {
  int lane;
  int warp;  ///< the warp in its CTA (its staging area)
  std::size_t first_tile;
  std::size_t tile_stride;

  __device__ __forceinline__ warp_walk()
      : lane(static_cast<int>(threadIdx.x % 32)), warp(static_cast<int>(threadIdx.x / 32)) {
    const std::size_t warps_per_cta = blockDim.x / 32;
    first_tile = blockIdx.x * warps_per_cta + warp;
    tile_stride = gridDim.x * warps_per_cta;
  }
};

/// warp_walk over the tiles of a tensor of `count` values coded by `Codec` and laid out
/// by `Layout`, with the tensor's block count, tile count and the frame's codes offset.
template <class Codec, class Layout>
struct codec_walk : warp_walk {
  std::size_t blocks;
  std::size_t tiles;
  std::size_t codes_offset;

  __device__ __forceinline__ explicit codec_walk(const codec_extent& e)
      : blocks(e.blocks), tiles(e.tiles), codes_offset(e.codes_offset) {}
  __device__ __forceinline__ explicit codec_walk(std::size_t count)
      : codec_walk(make_codec_extent<Codec, Layout>(count)) {}
};

/// One warp tile of `count` values laid out by `Layout` (a lane_layout), seen from `lane`:
/// the tile's values, and the lane's quantizer block and packing group in the tensor.
/// A lane is live when it codes a group of one of the tensor's `blocks` blocks; its group
/// then holds `valid` values (32 but at the tensor's ragged end), 0 when not live.
template <class Layout>
struct tile_lanes {
  std::size_t tile_first;  ///< index of the tile's first value
  std::size_t tile_n;      ///< values in the tile: values_per_warp but in the last tile
  bool full;               ///< tile_n == values_per_warp
  std::size_t block;       ///< the lane's quantizer block
  std::size_t group;       ///< the lane's packing group
  bool live;
  std::size_t first;  ///< index of the group's first value
  int valid;

  // Everything is computed in locals and stored last: deriving `valid` from the members
  // as they are written compiled to other SASS (encode: +2 registers, more spills with
  // staged feedback; reduce: +2 instructions). This form gives the kernels' former code.
  __device__ __forceinline__ tile_lanes(std::size_t tile, int lane, std::size_t count,
                                        std::size_t blocks) {
    const std::size_t t_first = tile * Layout::values_per_warp;
    const std::size_t t_rest = count - t_first;
    const std::size_t t_n = t_rest < Layout::values_per_warp ? t_rest : Layout::values_per_warp;
    const std::size_t b = tile * Layout::blocks_per_warp + Layout::block_of_lane(lane);
    const std::size_t g = b * Layout::groups_per_block + Layout::group_in_block(lane);
    const bool l = Layout::lane_active(lane) && b < blocks;
    const std::size_t f = g * 32;
    const int v = !l || f >= count ? 0 : (count - f < 32 ? static_cast<int>(count - f) : 32);
    tile_first = t_first;
    tile_n = t_n;
    full = t_n == Layout::values_per_warp;
    block = b;
    group = g;
    live = l;
    first = f;
    valid = v;
  }
};
#endif

}  // namespace lowbit::kernels::detail
