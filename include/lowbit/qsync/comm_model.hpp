// The cost of one gradient all-reduce at a given bit-width: lowbit's wire format, its
// two-stage all-reduce and its hierarchical all-reduce (with the overlap of its chunks
// on NCCL), reduced to bytes and seconds.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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

/// Which backend runs a hierarchical all-reduce. It decides whether the stages of different
/// chunks overlap: on NCCL they run on two streams linked by events (overlapped), on the MPI
/// host backend every step completes before the next (in turn).
enum class comm_backend { nccl, mpi };

/// The name of a comm_backend ("nccl", "mpi"), for messages and tables.
inline const char* to_string(comm_backend b) { return b == comm_backend::mpi ? "mpi" : "nccl"; }

/// A comm_backend by name, so that a command line or a cluster file can say which backend
/// the trainer uses; anything but "nccl" or "mpi" is an error naming the choices.
inline comm_backend parse_comm_backend(std::string_view name) {
  if (name == "nccl") return comm_backend::nccl;
  if (name == "mpi") return comm_backend::mpi;
  LOWBIT_EXPECTS(false, "unknown backend '" + std::string(name) + "' (nccl or mpi)");
  return comm_backend::nccl;
}

/// How a hierarchical call is cut into chunks: qsync's copy of a lowbit::schedule policy
/// (lowbit/schedule/schedule.hpp), since the chunk count decides how much of the call
/// overlaps and qsync depends on core only. `ramped` is schedule::ramped<max_chunks,
/// min_values> (min_values: the lightest chunk's values of each rank's share), else
/// schedule::pipelined<max_chunks, min_values> (min_values: a whole chunk's values);
/// max_chunks = 1 is schedule::flat. The default is the library's default_schedule.
struct comm_schedule {
  std::string name = "default";    ///< as builtin_schedule knows it, for tables and messages
  int max_chunks = 8;              ///< Chunks (pipelined) or MaxChunks (ramped)
  double min_values = 16777216.0;  ///< MinChunkValues (pipelined) or MinPieceValues (ramped)
  bool ramped = true;              ///< chunks weighted 1:2:4:...:4:2:1, else equal
};

/// Names accepted by builtin_schedule: those of lowbit-perf's --schedule, so that a
/// prediction can name the schedule a measurement ran.
inline std::vector<std::string> builtin_schedule_names() {
  return {"default",    "flat",       "pipelined",   "pipelined2",
          "pipelined4", "pipelined8", "pipelined16", "ramped23"};
}

/// A built-in schedule by name, as lowbit-perf builds them (bench/lowbit_perf/run.cuh):
/// default (ramped<8, 2^24>), flat, pipelined (pipelined<4, 2^25>), pipelinedK
/// (pipelined<K, 2^20>), ramped23 (ramped<8, 2^23>). An unknown name is an error listing
/// the built-ins.
inline comm_schedule builtin_schedule(std::string_view name) {
  const double small = 1048576.0;  // 2^20
  if (name == "default") return {"default", 8, 16777216.0, true};
  if (name == "flat") return {"flat", 1, 1.0, false};
  if (name == "pipelined") return {"pipelined", 4, 33554432.0, false};
  if (name == "pipelined2") return {"pipelined2", 2, small, false};
  if (name == "pipelined4") return {"pipelined4", 4, small, false};
  if (name == "pipelined8") return {"pipelined8", 8, small, false};
  if (name == "pipelined16") return {"pipelined16", 16, small, false};
  if (name == "ramped23") return {"ramped23", 8, 8388608.0, true};
  std::string known;
  for (const auto& n : builtin_schedule_names()) known += (known.empty() ? "" : ", ") + n;
  LOWBIT_EXPECTS(false, "unknown schedule '" + std::string(name) + "' (built-ins: " + known + ")");
  return {};
}

namespace detail {

/// schedule::ramp_weight and ramp_total, repeated (qsync depends on core only).
inline int ramp_weight(int chunks, int k) {
  const int d = k < chunks - 1 - k ? k : chunks - 1 - k;
  return d >= 2 ? 4 : 1 << d;
}
inline std::uint64_t ramp_total(int chunks) {
  std::uint64_t w = 0;
  for (int k = 0; k < chunks; ++k) w += static_cast<std::uint64_t>(ramp_weight(chunks, k));
  return w;
}

/// schedule::num_chunks<S>(count, 128, ranks), repeated: the chunks a flat collective of
/// `count` values over `ranks` (1 for a one-shot all-reduce) cuts its call into.
inline int num_chunks(std::uint64_t count, int ranks, const comm_schedule& s) {
  const std::uint64_t block = static_cast<std::uint64_t>(codec_block);
  const std::uint64_t per_rank = (count + block - 1) / block / static_cast<std::uint64_t>(ranks);
  const auto min_values = static_cast<std::uint64_t>(std::max(1.0, s.min_values));
  if (s.ramped) {
    const std::uint64_t values = count / static_cast<std::uint64_t>(ranks);
    int k = 1;
    while (k < s.max_chunks && ramp_total(k + 1) <= per_rank &&
           ramp_total(k + 1) * min_values <= values)
      ++k;
    return k;
  }
  const std::uint64_t k = std::min(
      {per_rank, count / min_values, static_cast<std::uint64_t>(std::max(1, s.max_chunks))});
  return static_cast<int>(std::max<std::uint64_t>(1, k));
}

}  // namespace detail

/// The chunks lowbit::hierarchical_all_reduce cuts a call of `count` values into on `nodes`
/// nodes of `per_node` ranks: the most that any rank's stage 2 (a flat all_reduce of its
/// rail shard over the nodes, one-shot on two nodes) cuts its shard into, which is rank 0's,
/// whose shard is the largest. One chunk (the stages one after the other) on one node, with
/// one rank per node (stage 2 alone), or with a coded node-local stage (intra_bits != 32),
/// which runs whole. The collectives' crossover to plain NCCL is taken to be off (its default).
inline int hierarchical_chunks(double count, int nodes, int per_node,
                               const comm_schedule& s = comm_schedule{}, int intra_bits = 32) {
  if (count <= 0 || nodes <= 1 || per_node <= 1 || intra_bits != 32 || s.max_chunks <= 1) return 1;
  const auto n = static_cast<std::uint64_t>(std::ceil(count));
  const std::uint64_t block = static_cast<std::uint64_t>(codec_block);
  const std::uint64_t blocks = (n + block - 1) / block;
  const std::uint64_t shard_blocks = (blocks + per_node - 1) / static_cast<std::uint64_t>(per_node);
  const std::uint64_t shard = std::min(n, shard_blocks * block);
  return detail::num_chunks(shard, nodes == 2 ? 1 : nodes, s);
}

/// The share of a call's values that chunk k of `chunks` holds under `s`: equal shares, or
/// ramp weights min(2^k, 2^(K-1-k), 4) over their sum for a ramped schedule (block
/// rounding left out), so that a chunk's stage times scale with what it moves.
inline double chunk_share(const comm_schedule& s, int chunks, int k) {
  if (!s.ramped || chunks <= 1) return 1.0 / std::max(1, chunks);
  return detail::ramp_weight(chunks, k) / static_cast<double>(detail::ramp_total(chunks));
}

/// Milliseconds of each chunk of each stage of a hierarchical all-reduce, in chunk order:
/// what both the overlapped (NCCL) and the in-turn (MPI) time are computed from, and what a
/// test or a table can look into.
struct hierarchical_stages {
  std::vector<double> reduce_scatter;  ///< stage 1, node-local, per chunk
  std::vector<double> rail;            ///< stage 2, cross-node low-bit all-reduce, per chunk
  std::vector<double> all_gather;      ///< stage 3, node-local, per chunk

  /// Chunks of the call.
  int chunks() const noexcept { return static_cast<int>(rail.size()); }

  /// Every chunk's every stage one after the other: the time of the MPI backend, and of a
  /// one-chunk call anywhere. With several chunks it is an upper bound of the NCCL time.
  double sum_ms() const {
    double t = 0.0;
    for (std::size_t k = 0; k < rail.size(); ++k) t += reduce_scatter[k] + rail[k] + all_gather[k];
    return t;
  }

  /// The longest of the three stages' totals over all chunks: no overlap can beat it, since
  /// each stage's chunks run in turn on their own stream.
  double slowest_stage_ms() const {
    double a = 0, b = 0, c = 0;
    for (std::size_t k = 0; k < rail.size(); ++k) {
      a += reduce_scatter[k];
      b += rail[k];
      c += all_gather[k];
    }
    return std::max({a, b, c});
  }

  /// The NCCL path's time (collective/hierarchical.hpp): stage 1 and 3 share the caller's
  /// stream, every chunk's stage 1 first and then every chunk's stage 3; stage 2 runs on a
  /// stream of its own. Chunk k's stage 2 starts once its stage 1 and the previous chunk's
  /// stage 2 are done; its stage 3 once its stage 2 and the stream's previous work are. So
  /// stage 2 hides behind the node-local stages, or they behind it, but stage 1 and 3 never
  /// overlap each other. Assumes the two communicators' kernels do not slow each other down.
  double pipelined_ms() const {
    const std::size_t K = rail.size();
    std::vector<double> staged(K), railed(K);
    double caller = 0.0, side = 0.0;
    for (std::size_t k = 0; k < K; ++k) staged[k] = caller += reduce_scatter[k];
    for (std::size_t k = 0; k < K; ++k) railed[k] = side = std::max(side, staged[k]) + rail[k];
    for (std::size_t k = 0; k < K; ++k) caller = std::max(caller, railed[k]) + all_gather[k];
    return caller;
  }
};

/// The stages of lowbit::hierarchical_all_reduce of `count` fp32 values on `nodes` nodes of
/// `per_node` ranks, cut into hierarchical_chunks(count, ...) chunks of chunk_share each.
/// A chunk of the node-local reduce-scatter or all-gather at `intra_bits` (32: full
/// precision) over `intra` costs G-1 latencies and (G-1)/G of its frames per rank; a chunk
/// of stage 2 is the flat low-bit all-reduce of its part of a 1/G shard over `inter` at
/// `bits` (all_reduce_ms: its 2(N-1) latencies, bytes and codec time, so every chunk pays
/// its own latencies and kernel overheads). Every rank's network link carries its rail's
/// traffic at once, so `inter` is the bandwidth of one rank's link (e.g. a 400 Gb/s NIC per
/// GPU). The intra stages' codec time is not counted.
inline hierarchical_stages hierarchical_stage_ms(int bits, double count, int nodes, int per_node,
                                                 const link_profile& intra,
                                                 const link_profile& inter,
                                                 const device_profile& dev, int intra_bits = 32,
                                                 const comm_schedule& s = comm_schedule{}) {
  LOWBIT_EXPECTS(nodes >= 1 && per_node >= 1,
                 "a hierarchical all-reduce needs nodes >= 1 and "
                 "ranks per node >= 1");
  hierarchical_stages st;
  if (count <= 0 || nodes * per_node == 1) {
    st.reduce_scatter = st.rail = st.all_gather = {0.0};
    return st;
  }
  if (per_node == 1) {  // stage 1 and 3 are copies: stage 2 alone, on the whole tensor
    st.reduce_scatter = st.all_gather = {0.0};
    st.rail = {all_reduce_ms(bits, count, nodes, inter, dev)};
    return st;
  }
  const int K = hierarchical_chunks(count, nodes, per_node, s, intra_bits);
  const double shard = std::ceil(count / per_node);
  for (int k = 0; k < K; ++k) {
    const double piece = shard * (K == 1 ? 1.0 : chunk_share(s, K, k));
    const double bytes = (per_node - 1) * wire_bytes(intra_bits, piece);
    const double local = (per_node - 1) * intra.latency_ms + bytes / (intra.bandwidth_gbs * 1e6);
    st.reduce_scatter.push_back(local);
    st.all_gather.push_back(local);
    st.rail.push_back(all_reduce_ms(bits, piece, nodes, inter, dev));
  }
  return st;
}

/// Milliseconds of lowbit::hierarchical_all_reduce (hierarchical_stage_ms's stages): on NCCL
/// the overlapped time of its chunks (pipelined_ms), on the MPI backend, which runs every
/// step in turn, their sum (sum_ms). With one chunk, as for most gradient buckets under the
/// default schedule, both are the sum of the three stages. What lowbit-plan prices a bucket
/// with, so that a bucket's bits are chosen against the time the backend really takes.
inline double hierarchical_all_reduce_ms(int bits, double count, int nodes, int per_node,
                                         const link_profile& intra, const link_profile& inter,
                                         const device_profile& dev, int intra_bits = 32,
                                         const comm_schedule& s = comm_schedule{},
                                         comm_backend backend = comm_backend::nccl) {
  const hierarchical_stages st =
      hierarchical_stage_ms(bits, count, nodes, per_node, intra, inter, dev, intra_bits, s);
  return backend == comm_backend::nccl ? st.pipelined_ms() : st.sum_ms();
}

}  // namespace lowbit::qsync
