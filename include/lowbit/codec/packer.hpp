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

namespace detail {
/// The device's byte permute (PTX prmt, default mode, selectors 0..7 only): byte k of the
/// result is byte (s >> 4k) & 7 of the eight bytes a (0..3) and b (4..7).
LOWBIT_HD std::uint32_t byte_perm(std::uint32_t a, std::uint32_t b, std::uint32_t s) {
#if LOWBIT_DEVICE_PASS
  return __byte_perm(a, b, s);
#else
  const std::uint64_t ab = (static_cast<std::uint64_t>(b) << 32) | a;
  std::uint32_t r = 0;
  for (int k = 0; k < 4; ++k)
    r |= static_cast<std::uint32_t>((ab >> (8 * ((s >> (4 * k)) & 7u))) & 0xffu) << (8 * k);
  return r;
#endif
}
}  // namespace detail

/// pack_group for codes held at bits [16, 32) of their words, with bits [0, 16) not the
/// codes' (what round::stochastic::index_high leaves): the same words as
/// pack_group(raw[i] >> 16), for raw[i] >> 16 < 2^Bits.
///
/// Widths of 1, 2, 4 and 8 bits take each code's byte 2 as it lies (a code fills a byte's
/// low bits): byte permutes gather, for each place s of the k = 8 / Bits codes a byte holds,
/// the four codes of a word that sit at place s of bytes 0..3 (three permutes), and the k
/// gathered words are added at shifts of s * Bits (a shift-add each). At 4 bits that is 7
/// integer instructions for 8 codes, where moving each code to bit 0 and into its place took
/// a shift, a mask and half an add a code. Other widths shift each code down first.
template <int Bits>
LOWBIT_HD void pack_group_high(const std::uint32_t (&raw)[group_size],
                               std::uint32_t (&words)[Bits]) {
  static_assert(Bits >= 1 && Bits <= 16, "lowbit::pack: the code width must be 1..16 bits");
  if constexpr (Bits == 1 || Bits == 2 || Bits == 4 || Bits == 8) {
    constexpr int k = 8 / Bits;      // codes a byte
    constexpr int per_word = 4 * k;  // codes a word
    LOWBIT_UNROLL
    for (int j = 0; j < Bits; ++j) {
      const std::uint32_t* r = raw + per_word * j;
      std::uint32_t w = 0;
      LOWBIT_UNROLL
      for (int p = 0; p < k; ++p) {
        // Code b * k + p of the word is byte 2 of r[b * k + p]; it goes to byte b.
        const std::uint32_t lo = detail::byte_perm(r[p], r[k + p], 0x0062u);
        const std::uint32_t hi = detail::byte_perm(r[2 * k + p], r[3 * k + p], 0x6200u);
        const std::uint32_t g = detail::byte_perm(lo, hi, 0x7610u);
        w = p == 0 ? g : w + (g << (p * Bits));
      }
      words[j] = w;
    }
  } else {
    std::uint32_t codes[group_size];
    LOWBIT_UNROLL
    for (int i = 0; i < group_size; ++i) codes[i] = raw[i] >> 16;
    pack_group<Bits>(codes, words);
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
