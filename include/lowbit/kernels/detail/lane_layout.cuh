// Which lane of a warp codes which packing group, and the warp-level reduction of a
// quantizer block's statistics across the lanes that share the block.
#pragma once

#include <cstdint>

#include "lowbit/codec/block_stats.hpp"
#include "lowbit/core/config.hpp"

namespace lowbit::kernels::detail {

/// The smallest power of two >= n (n >= 1).
constexpr int pow2_ceil(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

/// Lane layout for quantizer blocks of `GroupsPerBlock` packing groups.
///
/// A block's groups go to consecutive lanes, `lanes_per_block` of them (the next power
/// of two, so that the block's lanes are one `__shfl_xor_sync` butterfly); a warp codes
/// `blocks_per_warp` whole blocks per tile, so no block straddles two warps. When the
/// group count is not a power of two the extra lanes of each block idle.
template <int GroupsPerBlock>
struct lane_layout {
  static_assert(GroupsPerBlock >= 1 && GroupsPerBlock <= 32,
                "lowbit::kernels: the CUDA kernels support quantizer blocks of at most 1024 "
                "values (32 packing groups)");
  static constexpr int groups_per_block = GroupsPerBlock;
  static constexpr int lanes_per_block = pow2_ceil(GroupsPerBlock);
  static constexpr int blocks_per_warp = 32 / lanes_per_block;
  static constexpr int groups_per_warp = blocks_per_warp * groups_per_block;
  /// Values one warp codes per tile.
  static constexpr int values_per_warp = groups_per_warp * 32;

  /// The tile-local quantizer block of a lane.
  LOWBIT_HD static constexpr int block_of_lane(int lane) { return lane / lanes_per_block; }
  /// The lane's group inside its block (>= groups_per_block: an idle lane).
  LOWBIT_HD static constexpr int group_in_block(int lane) { return lane % lanes_per_block; }
  LOWBIT_HD static constexpr bool lane_active(int lane) {
    return group_in_block(lane) < groups_per_block;
  }
  /// The lane (staging row) that owns tile-local group g.
  LOWBIT_HD static constexpr int lane_of_group(int g) {
    // g itself when a block fills its lanes (the same for g >= 0): written out, the
    // staging offsets of warp_tile's transposes were recomputed for every vector of a tile
    // (ptxas did not see (g / 4) * 4 + g % 4 as g), instead of one address and immediates.
    if constexpr (groups_per_block == lanes_per_block) {
      return g;
    } else {
      return (g / groups_per_block) * lanes_per_block + g % groups_per_block;
    }
  }
};

#if LOWBIT_CUDA
/// Merges the block statistics of the `Lanes` consecutive lanes of each block so that
/// every one of them ends with the block's statistics.
///
/// block_stats::merge keeps its left operand on ties (+0 vs -0), so the merge order is
/// part of the result: each step merges the lower lanes' range with the upper lanes'
/// range, in element order, exactly as the host's left-to-right fold does. Both lanes of
/// a pair compute the same merge, so the block's lanes agree bit for bit.
template <int Lanes>
__device__ __forceinline__ quant::block_stats reduce_block_stats(quant::block_stats s, int lane) {
  LOWBIT_UNROLL
  for (int d = 1; d < Lanes; d <<= 1) {
    quant::block_stats other;
    other.min = __shfl_xor_sync(0xffffffffu, s.min, d);
    other.max = __shfl_xor_sync(0xffffffffu, s.max, d);
    if (lane & d) {
      other.merge(s);
      s = other;
    } else {
      s.merge(other);
    }
  }
  return s;
}
#endif

}  // namespace lowbit::kernels::detail
