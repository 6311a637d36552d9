// The 32 bytes in front of every frame a collective sends: what the sender's call was, so
// that a receiver (a host loop on the MPI backend, the consuming kernel itself on the NCCL
// backend) can tell a frame of its own call from a stranger's bytes before it decodes.
// LOWBIT_HD, so the host and the kernels judge a header by the same function.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lowbit/core/config.hpp"

namespace lowbit::detail {

/// The sender's call, as the receiver checks it. Trivially copyable, 32 bytes (keeps the
/// frame after it 16-byte aligned).
struct frame_header {
  std::uint32_t magic = 0;   ///< frame_magic; anything else is not a lowbit frame
  std::uint32_t config = 0;  ///< config_id: codec, element type, op, algorithm, feedback
  std::uint64_t count = 0;   ///< the call's element count
  std::uint32_t step = 0;    ///< the call's step (keys stochastic rounding)
  std::uint32_t seq = 0;     ///< calls the sender's collective object made before this one
  std::uint16_t bits = 0;    ///< code width
  std::uint16_t flags = 0;   ///< frame_flags
  std::uint32_t rank = 0;    ///< the sender
};
static_assert(sizeof(frame_header) == 32, "frame_header must stay 32 bytes");

inline constexpr std::uint32_t frame_magic = 0x4c42'4631u;  // "LBF1"

/// frame_header::flags.
enum frame_flags : std::uint16_t {
  /// The sender received a frame that disagreed with its call: this frame carries no data,
  /// only the news, so that every rank raises the error, not only the first to see it.
  poisoned = 1,
};

/// The first thing in which a received header differs from the receiver's call, in the
/// order the error names it.
enum class header_field : std::uint32_t {
  none = 0,  ///< the frame belongs to this call
  magic,     ///< not a lowbit frame at all (or not where this rank expects one)
  rank,      ///< the frame says it comes from another rank than the one it came from
  poisoned,  ///< the sender saw a disagreement and forwards the news
  count,
  bits,
  config,
  step,
  seq,
};

/// What differs between `got`, received from rank `from`, and `want`, this rank's call
/// (whose own rank field is not compared).
LOWBIT_HD header_field first_difference(const frame_header& got, const frame_header& want,
                                        std::uint32_t from) {
  if (got.magic != frame_magic) return header_field::magic;
  if (got.rank != from) return header_field::rank;
  if (got.flags & poisoned) return header_field::poisoned;
  if (got.count != want.count) return header_field::count;
  if (got.bits != want.bits) return header_field::bits;
  if (got.config != want.config) return header_field::config;
  if (got.step != want.step) return header_field::step;
  if (got.seq != want.seq) return header_field::seq;
  return header_field::none;
}

/// The headers a step that consumes frames checks before it writes anything: `count`
/// headers `stride` bytes apart from `first`, the one at index p sent by rank p, each
/// describing the call `want`. count 0: nothing to check. The host (agreement.hpp) and the
/// kernels (kernels::header_check) read the same type.
struct header_set {
  const std::byte* first = nullptr;
  std::size_t stride = 0;
  int count = 0;
  frame_header want;
};

}  // namespace lowbit::detail
