// The cost of one gradient all-reduce at a given bit-width: lowbit's wire format and
// its two-stage all-reduce, reduced to bytes and seconds.
#pragma once

#include <cmath>
#include <string>

#include "lowbit/core/error.hpp"
#include "lowbit/qsync/device_profile.hpp"

namespace lowbit::qsync {

/// Elements per quantization block in lowbit's codec.
inline constexpr double codec_block = 128.0;

/// Bytes of one encoded frame of `count` elements at `bits` per element.
///
/// This mirrors the codec's frame layout (lowbit/codec/codec.hpp, frame_bytes with an
/// fp32-scale quantizer and 128-element blocks): the blocks' 4-byte scales padded to 16
/// bytes, then 128 * bits / 8 = 16 * bits bytes of packed codes per block (the last
/// block padded to a full one), the whole frame padded to 16 bytes. bits = 32 is plain
/// fp32 and bits = 16 plain bf16 (no frame, no scales), which is what the collective
/// sends when it does not quantize. qsync depends on core only, so the formula is
/// repeated here rather than included; keep the two in step.
inline double wire_bytes(int bits, double count) {
  LOWBIT_EXPECTS(bits >= 1 && (bits <= 16 || bits == 32),
                 "communication bits must be 1..16 or 32, got " + std::to_string(bits));
  if (count <= 0) return 0.0;
  if (bits == 32) return 4.0 * count;
  if (bits == 16) return 2.0 * count;
  const auto align16 = [](double b) { return std::ceil(b / 16.0) * 16.0; };
  const double blocks = std::ceil(count / codec_block);
  return align16(align16(4.0 * blocks) + blocks * 16.0 * bits);
}

/// Bytes one rank sends in an all-reduce of `count` elements over `ranks` ranks: each
/// rank sends P-1 shard frames (all-to-all), then its reduced shard frame to P-1 peers
/// (all-gather), about 2 (P-1)/P of one full frame.
inline double all_reduce_bytes_per_rank(int bits, double count, int ranks) {
  LOWBIT_EXPECTS(ranks >= 1, "an all-reduce needs at least one rank");
  if (ranks == 1) return 0.0;
  const double shard = std::ceil(count / ranks);
  return 2.0 * (ranks - 1) * wire_bytes(bits, shard);
}

/// Milliseconds of codec kernels on `dev` for one all-reduce: encode the input, decode
/// the P shard frames and re-encode the reduced shard, decode the gathered frames.
/// Memory-bound, so it is bytes touched over bandwidth plus four kernel calls at the
/// quantize fit's fixed cost (its launch and amax tail); zero when
/// bits = 32 (plain NCCL). bf16 costs the two casts around a plain all-reduce.
inline double codec_ms(int bits, double count, int ranks, const device_profile& dev) {
  if (bits == 32 || count <= 0 || ranks == 1) return 0.0;
  if (bits == 16) return dev.casts.float_to_float.at(count) * 2.0;
  const double frame = wire_bytes(bits, count);
  // fp32 in + frame out; P shard frames in + fp32 shard sums + frame out; frame in + fp32 out.
  const double touched =
      4.0 * count + frame + frame + 4.0 * count / ranks + frame / ranks + frame + 4.0 * count;
  return touched / dev.bytes_per_ms() + 4.0 * dev.casts.quantize.b_ms;
}

/// Milliseconds of one all-reduce: alpha + wire bytes / bandwidth + codec time, with
/// alpha = 2 (P-1) ring-step latencies.
inline double all_reduce_ms(int bits, double count, int ranks, const link_profile& link,
                            const device_profile& dev) {
  if (ranks == 1 || count <= 0) return 0.0;
  const double alpha = 2.0 * (ranks - 1) * link.latency_ms;
  const double wire = all_reduce_bytes_per_rank(bits, count, ranks) / (link.bandwidth_gbs * 1e6);
  return alpha + wire + codec_ms(bits, count, ranks, dev);
}

/// Milliseconds of lowbit::hierarchical_all_reduce on `nodes` nodes of `per_node` ranks:
/// the node-local reduce-scatter and all-gather at `intra_bits` (32: full precision) over
/// `intra`, each (G-1)/G of the tensor's frames per rank at G-1 latencies, plus the flat
/// low-bit all-reduce of a 1/G shard over `inter` at `bits` (all_reduce_ms, codec time
/// included). The stages add up: an upper bound, since on NCCL a call of several chunks
/// overlaps them (docs/multi-node.md); a call of one chunk runs them one after the other,
/// as the MPI backend always does. Every rank's
/// network link carries its rail's traffic at once, so `inter` is the bandwidth of one
/// rank's link (e.g. a 400 Gb/s NIC per GPU). The intra stages' codec time is not counted.
inline double hierarchical_all_reduce_ms(int bits, double count, int nodes, int per_node,
                                         const link_profile& intra, const link_profile& inter,
                                         const device_profile& dev, int intra_bits = 32) {
  LOWBIT_EXPECTS(nodes >= 1 && per_node >= 1,
                 "a hierarchical all-reduce needs nodes >= 1 and "
                 "ranks per node >= 1");
  if (count <= 0 || nodes * per_node == 1) return 0.0;
  const double shard = std::ceil(count / per_node);
  double intra_ms = 0.0;
  if (per_node > 1) {
    const double bytes = (per_node - 1) * wire_bytes(intra_bits, shard);
    intra_ms = 2.0 * ((per_node - 1) * intra.latency_ms + bytes / (intra.bandwidth_gbs * 1e6));
  }
  return intra_ms + all_reduce_ms(bits, shard, nodes, inter, dev);
}

}  // namespace lowbit::qsync
