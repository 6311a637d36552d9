// A warp's tile of values staged through shared memory, so that global memory sees
// coalesced 16-byte vectors while each lane works on its own packing group of 32
// consecutive values (a transpose between the "striped" layout of a coalesced access
// and the "blocked" layout the codec needs).
#pragma once

#include <cstddef>
#include <cstdint>

#include "lowbit/core/config.hpp"
#include "lowbit/kernels/detail/raw_bits.cuh"

namespace lowbit::kernels::detail {

/// Shared-memory bytes of one warp's staging area for elements of `Size` bytes.
///
/// Row r holds the 32 values of the group that lane r codes, padded by 16 bytes: a
/// quarter-warp writing one row in 16-byte pieces and a quarter-warp reading 8 rows at
/// the same column then both touch 32 distinct banks.
constexpr int staging_row_bytes(int size) { return 32 * size + 16; }
constexpr int staging_bytes(int size) { return 32 * staging_row_bytes(size); }

/// Moves a tile of `Layout::values_per_warp` elements of T between global memory and
/// the lanes' registers, through the warp's staging area `s`. Every lane of the warp
/// must call each function (they contain __syncwarp).
template <class T, class Layout>
struct warp_tile {
  static constexpr int size = static_cast<int>(sizeof(T));
  static constexpr int row_bytes = staging_row_bytes(size);
  static constexpr int per_vector = 16 / size;  ///< elements in one 16-byte vector
  static constexpr int vectors = Layout::values_per_warp / per_vector;
  static constexpr int vectors_per_lane = (vectors + 31) / 32;
  static constexpr int row_words = 32 * size / 4;

  /// Global vectors a lane holds between a coalesced access and the staging area.
  struct striped {
    uint4 v[vectors_per_lane];
  };
  /// One lane's group as raw words.
  struct row {
    std::uint32_t w[row_words];
  };

  /// Byte offset in the staging area of tile element e.
  __device__ __forceinline__ static int offset(int e) {
    return Layout::lane_of_group(e / 32) * row_bytes + (e % 32) * size;
  }
  /// offset of striped vector k of `lane`, (lane + 32 k) * per_vector. Where a block fills
  /// its lanes (lane_of_group(g) = g), vector k lies per_vector * k rows below vector 0: one
  /// address a lane and immediate offsets (ptxas recomputed each vector's address from the
  /// lane, up to 6 instructions a vector, when it was written as offset(e)).
  __device__ __forceinline__ static int vector_offset(int lane, int k) {
    if constexpr (Layout::groups_per_block == Layout::lanes_per_block) {
      return offset(lane * per_vector) + k * per_vector * row_bytes;
    } else {
      return offset((lane + 32 * k) * per_vector);
    }
  }
  __device__ __forceinline__ static bool has_vector(int k, int lane) {
    return vectors % 32 == 0 || lane + 32 * k < vectors;
  }

  /// Reads a full tile at a 16-byte aligned `g` (read-only data: the non-coherent path).
  __device__ __forceinline__ static void load_ro(const T* g, int lane, striped& r) {
    const uint4* p = reinterpret_cast<const uint4*>(g);
    LOWBIT_UNROLL
    for (int k = 0; k < vectors_per_lane; ++k)
      if (has_vector(k, lane)) r.v[k] = __ldg(p + lane + 32 * k);
  }
  /// Reads a full tile of data that this kernel also writes (feedback state).
  __device__ __forceinline__ static void load_rw(const T* g, int lane, striped& r) {
    const uint4* p = reinterpret_cast<const uint4*>(g);
    LOWBIT_UNROLL
    for (int k = 0; k < vectors_per_lane; ++k)
      if (has_vector(k, lane)) r.v[k] = p[lane + 32 * k];
  }
  /// Writes a full tile at a 16-byte aligned `g`.
  __device__ __forceinline__ static void store(T* g, int lane, const striped& r) {
    uint4* p = reinterpret_cast<uint4*>(g);
    LOWBIT_UNROLL
    for (int k = 0; k < vectors_per_lane; ++k)
      if (has_vector(k, lane)) p[lane + 32 * k] = r.v[k];
  }

  /// Striped vectors -> staging area -> each lane's row.
  __device__ __forceinline__ static void transpose_in(unsigned char* s, int lane, const striped& r,
                                                      row& out) {
    LOWBIT_UNROLL
    for (int k = 0; k < vectors_per_lane; ++k)
      if (has_vector(k, lane)) *reinterpret_cast<uint4*>(s + vector_offset(lane, k)) = r.v[k];
    __syncwarp();
    read_row(s, lane, out);
    __syncwarp();
  }
  /// Each lane's row -> staging area -> striped vectors.
  __device__ __forceinline__ static void transpose_out(unsigned char* s, int lane, const row& in,
                                                       striped& r) {
    write_row(s, lane, in);
    __syncwarp();
    LOWBIT_UNROLL
    for (int k = 0; k < vectors_per_lane; ++k)
      if (has_vector(k, lane)) r.v[k] = *reinterpret_cast<const uint4*>(s + vector_offset(lane, k));
    __syncwarp();
  }

  /// The first n elements at any (element-aligned) `g`, one element per lane and step:
  /// the path for the tail tile and for pointers that are not 16-byte aligned. Rows
  /// beyond n are left unset.
  __device__ __forceinline__ static void load_scalar(const T* g, std::size_t n, unsigned char* s,
                                                     int lane, row& out) {
    // A fixed count of predicated steps, not a loop to n: the trip count of a loop to n
    // (unrolled by ptxas) was computed on every tile's path, the vector one included.
    LOWBIT_UNROLL
    for (int k = 0; k < Layout::values_per_warp / 32; ++k) {
      const int e = lane + 32 * k;
      if (e < static_cast<int>(n)) *reinterpret_cast<T*>(s + offset(e)) = g[e];
    }
    __syncwarp();
    read_row(s, lane, out);
    __syncwarp();
  }
  __device__ __forceinline__ static void store_scalar(T* g, std::size_t n, unsigned char* s,
                                                      int lane, const row& in) {
    write_row(s, lane, in);
    __syncwarp();
    LOWBIT_UNROLL
    for (int k = 0; k < Layout::values_per_warp / 32; ++k) {
      const int e = lane + 32 * k;
      if (e < static_cast<int>(n)) g[e] = *reinterpret_cast<const T*>(s + offset(e));
    }
    __syncwarp();
  }

 private:
  __device__ __forceinline__ static void read_row(const unsigned char* s, int lane, row& out) {
    const uint4* p = reinterpret_cast<const uint4*>(s + lane * row_bytes);
    LOWBIT_UNROLL
    for (int j = 0; j < row_words / 4; ++j) {
      const uint4 v = p[j];
      out.w[4 * j] = v.x;
      out.w[4 * j + 1] = v.y;
      out.w[4 * j + 2] = v.z;
      out.w[4 * j + 3] = v.w;
    }
  }
  __device__ __forceinline__ static void write_row(unsigned char* s, int lane, const row& in) {
    uint4* p = reinterpret_cast<uint4*>(s + lane * row_bytes);
    LOWBIT_UNROLL
    for (int j = 0; j < row_words / 4; ++j)
      p[j] = make_uint4(in.w[4 * j], in.w[4 * j + 1], in.w[4 * j + 2], in.w[4 * j + 3]);
  }
};

}  // namespace lowbit::kernels::detail
