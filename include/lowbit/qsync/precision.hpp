// The compute precisions QSync chooses between, and the facts about each that the cost
// model, the memory model and the indicator need.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "lowbit/core/error.hpp"

namespace lowbit::qsync {

/// A compute precision. Declared in rank order: a later value is never faster on the
/// same chip and never stores fewer bits, which is the order the allocator promotes in.
enum class precision : std::uint8_t { int8, fp8, fp16, bf16, tf32, fp32 };

/// How many precisions there are (the size of per-precision tables).
inline constexpr int precision_count = 6;

/// Every precision, in rank order.
inline constexpr std::array<precision, precision_count> all_precisions = {
    precision::int8, precision::fp8,  precision::fp16,
    precision::bf16, precision::tf32, precision::fp32};

/// Index of `p` in per-precision tables.
constexpr int index_of(precision p) noexcept { return static_cast<int>(p); }

/// Bits one stored element takes (tf32 is computed in tensor cores but stored as fp32).
constexpr int storage_bits(precision p) noexcept {
  switch (p) {
    case precision::int8:
    case precision::fp8:
      return 8;
    case precision::fp16:
    case precision::bf16:
      return 16;
    default:
      return 32;
  }
}

/// The precision of the tensors an op at `p` takes and hands on. An fp8 op is a GEMM that
/// casts its operands to fp8 inside itself (with their current scales) and rounds its
/// output to bf16 in the GEMM's epilogue, as lowbit's plan applier, Transformer Engine and
/// torchao's float8 run it: the tensors between it and its neighbours are bf16, and an op
/// that only follows it (a parameter-free op) runs at bf16. Every other precision carries
/// itself.
constexpr precision carried_precision(precision p) noexcept {
  return p == precision::fp8 ? precision::bf16 : p;
}

/// Explicit mantissa bits of a floating format (fp8 means E4M3, the training forward
/// format); 0 for int8, whose error is set by its scale instead.
constexpr int mantissa_bits(precision p) noexcept {
  switch (p) {
    case precision::int8:
      return 0;
    case precision::fp8:
      return 3;
    case precision::fp16:
    case precision::tf32:
      return 10;
    case precision::bf16:
      return 7;
    default:
      return 23;
  }
}

/// The exponent range [min_exponent, max_exponent] of normal numbers of a floating
/// format; the indicator clips an amax's exponent into it.
constexpr int min_exponent(precision p) noexcept {
  return p == precision::fp16 ? -14 : p == precision::fp8 ? -6 : -126;
}
/// See min_exponent.
constexpr int max_exponent(precision p) noexcept {
  return p == precision::fp16 ? 15 : p == precision::fp8 ? 8 : 127;
}

/// The lowercase name used in JSON and on the command line ("int8", "fp16", ...).
constexpr const char* to_string(precision p) noexcept {
  constexpr const char* names[] = {"int8", "fp8", "fp16", "bf16", "tf32", "fp32"};
  return names[index_of(p)];
}

/// Parses a precision name; throws invalid_argument naming the bad text.
inline precision parse_precision(std::string_view text) {
  for (precision p : all_precisions)
    if (text == to_string(p)) return p;
  LOWBIT_EXPECTS(false, "unknown precision '" + std::string(text) +
                            "' (expected int8, fp8, fp16, bf16, tf32 or fp32)");
  return precision::fp32;
}

}  // namespace lowbit::qsync
