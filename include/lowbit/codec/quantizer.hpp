// The quantizer concept, and the readable error for a type that is not one.
//
// A quantizer Q maps one block of Q::block_size floats to codes of Q::bits bits plus
// a Q::meta_type that travels in the frame. It provides, all LOWBIT_HD and static:
//   meta_type   make_meta(const block_stats&);        // the block's scale from its stats
//   params_type make_params(const meta_type&);        // per-block constants for encoding
//   template <class Rounding>
//   uint32_t    quantize(float x, const params_type&, uint32_t noise16);
//   float       dequantize(uint32_t code, const meta_type&);
//   float       step(const meta_type&);               // grid spacing, for error bounds
// and the constants `is_lowbit_quantizer`, `bits`, `block_size`, `name`; optionally
// `symmetric = true` when make_meta reads the stats only through absmax() and
// poisoned(), which lets the encode kernel take one instruction a value for them.
#pragma once

#include <type_traits>

#include "lowbit/codec/absmax.hpp"
#include "lowbit/codec/block_stats.hpp"
#include "lowbit/codec/fp8.hpp"
#include "lowbit/codec/minmax.hpp"

namespace lowbit::quant {

template <class Q, class = void>
struct is_quantizer : std::false_type {};
template <class Q>
struct is_quantizer<Q, std::enable_if_t<Q::is_lowbit_quantizer>> : std::true_type {};
/// True when Q models lowbit's quantizer concept.
template <class Q>
inline constexpr bool is_quantizer_v = is_quantizer<Q>::value;

template <class Q, class = void>
struct is_symmetric : std::false_type {};
template <class Q>
struct is_symmetric<Q, std::enable_if_t<Q::symmetric>> : std::true_type {};
/// True when Q declares `symmetric = true`: its make_meta reads absmax() and poisoned()
/// of the block stats, never min or max alone.
template <class Q>
inline constexpr bool is_symmetric_v = is_symmetric<Q>::value;

}  // namespace lowbit::quant
