// Dense little-endian bit packing: code i of a stream occupies bits [i*b, (i+1)*b).
// The unit of work is a group of 32 codes, which fills exactly `b` 32-bit words for
// any width b in 1..16: one thread packs one group into whole words with no
// read-modify-write, and consecutive groups form one contiguous bit stream.
#pragma once

#include <cstdint>

#include "lowbit/core/config.hpp"

namespace lowbit::pack {

/// Codes per packing group.
inline constexpr int group_size = 32;

/// Packs 32 codes of `Bits` bits (each < 2^Bits) into `Bits` words.
///
/// The codes' bits never overlap, so adding them in is or-ing them in; the sum lets the
/// device compiler make each code's shift-and-insert one multiply-add (a shift and half a
/// three-input or before), on the multiply-add pipe rather than the integer one.
template <int Bits>
LOWBIT_HD void pack_group(const std::uint32_t (&codes)[group_size], std::uint32_t (&words)[Bits]) {
  static_assert(Bits >= 1 && Bits <= 16, "lowbit::pack: the code width must be 1..16 bits");
  LOWBIT_UNROLL
  for (int j = 0; j < Bits; ++j) words[j] = 0;
  LOWBIT_UNROLL
  for (int i = 0; i < group_size; ++i) {
    const int bit = i * Bits, word = bit >> 5, offset = bit & 31;
    words[word] += codes[i] << offset;
    if (offset + Bits > 32) words[word + 1] += codes[i] >> (32 - offset);
  }
}

/// Unpacks `Bits` words into 32 codes: the inverse of pack_group.
template <int Bits>
LOWBIT_HD void unpack_group(const std::uint32_t (&words)[Bits],
                            std::uint32_t (&codes)[group_size]) {
  static_assert(Bits >= 1 && Bits <= 16, "lowbit::pack: the code width must be 1..16 bits");
  constexpr std::uint32_t mask = (1u << Bits) - 1u;
  LOWBIT_UNROLL
  for (int i = 0; i < group_size; ++i) {
    const int bit = i * Bits, word = bit >> 5, offset = bit & 31;
    std::uint32_t v = words[word] >> offset;
    if (offset + Bits > 32) v |= words[word + 1] << (32 - offset);
    codes[i] = v & mask;
  }
}

}  // namespace lowbit::pack
