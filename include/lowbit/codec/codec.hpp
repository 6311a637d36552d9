// A codec = quantizer + rounding, and the wire format of its frames.
//
// Frame of `count` values (16-byte aligned, size a function of count alone):
//
//   [meta of block 0][meta of block 1]...  padded to 16 bytes with zeros
//   [codes of block 0][codes of block 1]... each block_size*bits/8 bytes, the code
//                                           stream of a block dense and little-endian
//
// The last block may be partial; its missing elements are coded as 0 and ignored.
// Kernels and the host executor both work in groups of 32 values (one packed group is
// `bits` words) and call the functions below unchanged, so both write the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "lowbit/codec/packer.hpp"
#include "lowbit/codec/philox.hpp"
#include "lowbit/codec/quantizer.hpp"
#include "lowbit/codec/rounding.hpp"
#include "lowbit/core/config.hpp"

namespace lowbit {

/// Rounds n up to a multiple of 16 (frame sections are 16-byte aligned).
LOWBIT_HD constexpr std::size_t align16(std::size_t n) { return (n + 15) & ~std::size_t{15}; }

namespace detail {
template <class Q, class R, class = void>
struct has_quantize_high : std::false_type {};
template <class Q, class R>
struct has_quantize_high<
    Q, R,
    std::enable_if_t<round::has_index_high_v<R>,
                     std::void_t<decltype(Q::template quantize_high<R>(
                         0.0f, std::declval<const typename Q::params_type&>(), 0u))>>>
    : std::true_type {};
}  // namespace detail

/// A quantizer and a rounding policy, and the frame layout they imply.
template <class Quantizer, class Rounding = round::nearest>
struct codec {
  static_assert(quant::is_quantizer_v<Quantizer>,
                "lowbit::codec: the first parameter must be a quantizer such as "
                "lowbit::quant::absmax<4>, minmax<4> or fp8<e4m3>");
  static_assert(round::is_rounding_v<Rounding>,
                "lowbit::codec: the second parameter must be a rounding policy: "
                "lowbit::round::nearest or lowbit::round::stochastic");

  using quantizer_type = Quantizer;
  using rounding_type = Rounding;
  using meta_type = typename Quantizer::meta_type;
  using params_type = typename Quantizer::params_type;

  static constexpr int bits = Quantizer::bits;
  static constexpr int block_size = Quantizer::block_size;
  static constexpr int group_size = pack::group_size;
  static constexpr int groups_per_block = block_size / group_size;
  /// Packed bytes of one group of 32 codes, and of one block.
  static constexpr std::size_t group_bytes = 4 * bits;
  static constexpr std::size_t block_code_bytes = groups_per_block * group_bytes;

  /// Blocks covering `count` values.
  LOWBIT_HD static constexpr std::size_t num_blocks(std::size_t count) {
    return (count + block_size - 1) / block_size;
  }
  /// Byte offset of the code section (the meta section's padded size).
  LOWBIT_HD static constexpr std::size_t codes_offset(std::size_t count) {
    return align16(num_blocks(count) * sizeof(meta_type));
  }
  /// Bytes of a frame holding `count` values: what the wire carries.
  LOWBIT_HD static constexpr std::size_t frame_bytes(std::size_t count) {
    return align16(codes_offset(count) + num_blocks(count) * block_code_bytes);
  }

  /// Quantizes one group of 32 values whose first has tensor index `index0` (a
  /// multiple of 32): codes for x[0, valid), code 0 for the rest.
  LOWBIT_HD static void quantize_group(const float (&x)[group_size], int valid,
                                       const params_type& p, const rng_key& key,
                                       std::uint64_t index0, std::uint32_t (&codes)[group_size]) {
    if constexpr (Rounding::needs_noise) {
      constexpr int D = rng_key::values_per_draw;
      LOWBIT_UNROLL
      for (int k = 0; k < group_size / D; ++k) {
        const philox_block r = key.draw(index0 / D + k);
        LOWBIT_UNROLL
        for (int m = 0; m < D; ++m) {
          const int i = D * k + m;
          const std::uint32_t noise = rng_key::noise16(r, m);
          codes[i] = i < valid ? Quantizer::template quantize<Rounding>(x[i], p, noise) : 0u;
        }
      }
    } else {
      LOWBIT_UNROLL
      for (int i = 0; i < group_size; ++i)
        codes[i] = i < valid ? Quantizer::template quantize<Rounding>(x[i], p, 0u) : 0u;
    }
  }

  /// True when the quantizer and the rounding can leave codes at bits [16, 32)
  /// (Quantizer::quantize_high, Rounding::index_high: absmax with stochastic rounding), for
  /// quantize_group_high and pack::pack_group_high.
  static constexpr bool high_codes = detail::has_quantize_high<Quantizer, Rounding>::value;

  /// quantize_group with each code at bits [16, 32) of its word and bits [0, 16) not the
  /// code's: (raw[i] >> 16) is quantize_group's codes[i]; 0 past valid.
  LOWBIT_HD static void quantize_group_high(const float (&x)[group_size], int valid,
                                            const params_type& p, const rng_key& key,
                                            std::uint64_t index0,
                                            std::uint32_t (&raw)[group_size]) {
    static_assert(high_codes, "lowbit::codec::quantize_group_high: not for this codec");
    constexpr int D = rng_key::values_per_draw;
    LOWBIT_UNROLL
    for (int k = 0; k < group_size / D; ++k) {
      const philox_block r = key.draw(index0 / D + k);
      LOWBIT_UNROLL
      for (int m = 0; m < D; ++m) {
        const int i = D * k + m;
        const std::uint32_t noise = rng_key::noise16(r, m);
        raw[i] = i < valid ? Quantizer::template quantize_high<Rounding>(x[i], p, noise) : 0u;
      }
    }
  }

  /// Decodes one group's codes.
  LOWBIT_HD static void dequantize_group(const std::uint32_t (&codes)[group_size],
                                         const meta_type& m, float (&y)[group_size]) {
    LOWBIT_UNROLL
    for (int i = 0; i < group_size; ++i) y[i] = Quantizer::dequantize(codes[i], m);
  }

  /// Packs / unpacks one group (`bits` words).
  LOWBIT_HD static void pack(const std::uint32_t (&codes)[group_size],
                             std::uint32_t (&words)[bits]) {
    pack::pack_group<bits>(codes, words);
  }
  LOWBIT_HD static void unpack(const std::uint32_t (&words)[bits],
                               std::uint32_t (&codes)[group_size]) {
    pack::unpack_group<bits>(words, codes);
  }
};

template <class C>
struct is_codec : std::false_type {};
template <class Q, class R>
struct is_codec<codec<Q, R>> : std::true_type {};
/// True for lowbit::codec<...> types.
template <class C>
inline constexpr bool is_codec_v = is_codec<C>::value;

}  // namespace lowbit
