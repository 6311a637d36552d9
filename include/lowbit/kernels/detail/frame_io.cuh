// Loads and stores of a frame's pieces: one group's packed words (as wide as their
// alignment allows) and one block's metadata.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lowbit/core/config.hpp"

namespace lowbit::kernels::detail {

/// Loads the `Bits` packed words of one group. A group starts at a multiple of 4*Bits
/// bytes from a 16-byte aligned code section: 16-byte vectors when Bits % 4 == 0,
/// 8-byte ones when Bits is even, words otherwise.
template <int Bits>
__device__ __forceinline__ void load_words(const std::byte* p, std::uint32_t (&w)[Bits]) {
  if constexpr (Bits % 4 == 0) {
    LOWBIT_UNROLL
    for (int j = 0; j < Bits / 4; ++j) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + j);
      w[4 * j] = v.x;
      w[4 * j + 1] = v.y;
      w[4 * j + 2] = v.z;
      w[4 * j + 3] = v.w;
    }
  } else if constexpr (Bits % 2 == 0) {
    LOWBIT_UNROLL
    for (int j = 0; j < Bits / 2; ++j) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(p) + j);
      w[2 * j] = v.x;
      w[2 * j + 1] = v.y;
    }
  } else {
    LOWBIT_UNROLL
    for (int j = 0; j < Bits; ++j) w[j] = __ldg(reinterpret_cast<const unsigned int*>(p) + j);
  }
}

/// Stores the `Bits` packed words of one group (same alignment as load_words).
template <int Bits>
__device__ __forceinline__ void store_words(std::byte* p, const std::uint32_t (&w)[Bits]) {
  if constexpr (Bits % 4 == 0) {
    LOWBIT_UNROLL
    for (int j = 0; j < Bits / 4; ++j)
      reinterpret_cast<uint4*>(p)[j] =
          make_uint4(w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]);
  } else if constexpr (Bits % 2 == 0) {
    LOWBIT_UNROLL
    for (int j = 0; j < Bits / 2; ++j)
      reinterpret_cast<uint2*>(p)[j] = make_uint2(w[2 * j], w[2 * j + 1]);
  } else {
    LOWBIT_UNROLL
    for (int j = 0; j < Bits; ++j) reinterpret_cast<std::uint32_t*>(p)[j] = w[j];
  }
}

/// Block `block`'s metadata into a frame (the meta section starts the frame, which is
/// 16-byte aligned; every meta type is a struct of floats).
template <class Meta>
__device__ __forceinline__ void store_meta(std::byte* frame, std::size_t block, const Meta& m) {
  reinterpret_cast<Meta*>(frame)[block] = m;
}

/// Zeroes the meta section's padding (the under 16 bytes between the last block's meta
/// and the codes), so that every byte of a frame is defined and the same as the host
/// codec's: frames are compared, hashed and sent whole. One thread of the grid calls it.
template <class Meta>
__device__ __forceinline__ void zero_meta_padding(std::byte* frame, std::size_t blocks,
                                                  std::size_t codes_offset) {
  for (std::size_t i = blocks * sizeof(Meta); i < codes_offset; ++i) frame[i] = std::byte{0};
}

}  // namespace lowbit::kernels::detail
