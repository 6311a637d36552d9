// Schedules: how a tensor is cut into per-rank shards, and each shard into the pieces
// that one chunk of a pipelined call moves. Plain arithmetic, shared by every backend,
// so that the host and device paths cut (and therefore encode) a tensor identically.
//
// A shard is a range of whole quantizer blocks: its first element index is a multiple
// of the block size (so of 32, which keys stochastic rounding), and its frame is
// self-contained. Blocks are dealt out as evenly as possible (the first ranks get one
// more when they do not divide); shards may be empty, and only the last non-empty
// shard of the tensor can end in a partial block. No divisibility is required.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>

namespace lowbit::schedule {

/// One pass per stage over the whole tensor: the least launches and messages.
struct flat {
  static constexpr bool is_schedule_policy = true;
  static constexpr int max_chunks = 1;
  static constexpr std::size_t min_chunk_values = 1;
  static constexpr int streams = 1;
  static constexpr const char* name = "flat";
};

/// Cuts every rank's shard into up to `Chunks` pieces (whole blocks); chunk k is piece
/// k of every shard (of the whole tensor in a one-shot all_reduce), reduced as an
/// independent flat collective. On NCCL the stages of
/// the chunks run on two streams (the caller's for encoding and decoding, an internal
/// one for the transfers) linked by events only, so that encoding chunk k+1 overlaps
/// the transfer of chunk k. Each rank's shard stays one contiguous range (what
/// reduce_scatter returns and all_gather takes). A chunk holds at least
/// `MinChunkValues` values and each piece at least one block, so smaller tensors use
/// fewer chunks (a single one is the flat schedule, on the caller's stream alone).
/// The defaults are few, large chunks because each chunk adds an NCCL call's latency
/// (figures in docs/performance.md). The host backend runs the same chunks one after the
/// other and computes the same bytes.
template <int Chunks = 4, std::size_t MinChunkValues = (std::size_t{1} << 25)>
struct pipelined {
  static_assert(Chunks >= 1 && Chunks <= 64,
                "lowbit::schedule::pipelined: Chunks must be in 1..64");
  static_assert(MinChunkValues >= 1, "lowbit::schedule::pipelined: MinChunkValues must be >= 1");
  static constexpr bool is_schedule_policy = true;
  static constexpr int max_chunks = Chunks;
  static constexpr std::size_t min_chunk_values = MinChunkValues;
  static constexpr int streams = 2;
  static constexpr const char* name = "pipelined";
};

/// Pipelined chunks of unequal size: small at both ends, larger in the middle, so that
/// the stages that cannot overlap anything (encoding the first chunk, decoding the last)
/// are short while the middle transfers stay large enough to run at full speed. Chunk k
/// of K weighs min(2^k, 2^(K-1-k), 4): K = 4 cuts 1:2:2:1, K = 6 1:2:4:4:2:1. K is the
/// largest (at most MaxChunks) whose lightest chunk still holds MinPieceValues values of
/// each rank's share. Where the transfers bound the call, uniform chunks leave the first
/// encode and the last decode unoverlapped, the more so the fewer the chunks (figures in
/// docs/performance.md).
template <int MaxChunks = 8, std::size_t MinPieceValues = (std::size_t{1} << 24)>
struct ramped {
  static_assert(MaxChunks >= 1 && MaxChunks <= 64,
                "lowbit::schedule::ramped: MaxChunks must be in 1..64");
  static_assert(MinPieceValues >= 1, "lowbit::schedule::ramped: MinPieceValues must be >= 1");
  static constexpr bool is_schedule_policy = true;
  static constexpr int max_chunks = MaxChunks;
  /// The lightest chunk's values of each rank's share (pipelined's min_chunk_values counts
  /// a whole chunk, over every rank: another quantity, so another name).
  static constexpr std::size_t min_piece_values = MinPieceValues;
  static constexpr int streams = 2;
  static constexpr bool ramp = true;
  static constexpr const char* name = "ramped";
};

/// The collectives' default: one flat pass below 2 x 2^24 values per rank's share (a
/// one-chunk call runs on the caller's stream alone, as schedule::flat does), up to 8
/// ramped chunks above (the measurements behind it: docs/performance.md).
using default_schedule = ramped<>;

template <class S, class = void>
struct is_schedule_policy : std::false_type {};
template <class S>
struct is_schedule_policy<S, std::enable_if_t<S::is_schedule_policy>> : std::true_type {};
/// True for schedule::flat and schedule::pipelined<...>.
template <class S>
inline constexpr bool is_schedule_policy_v = is_schedule_policy<S>::value;

template <class S, class = void>
struct ramps : std::false_type {};
template <class S>
struct ramps<S, std::enable_if_t<S::ramp>> : std::true_type {};
/// True for a schedule whose chunks ramp up and down (schedule::ramped).
template <class S>
inline constexpr bool ramps_v = ramps<S>::value;

/// The weight of chunk k of K in a ramped schedule: min(2^k, 2^(K-1-k), 4).
constexpr std::size_t ramp_weight(int chunks, int k) {
  const int d = k < chunks - 1 - k ? k : chunks - 1 - k;
  return d >= 2 ? 4 : std::size_t{1} << d;
}
/// The summed weights of K ramped chunks.
constexpr std::size_t ramp_total(int chunks) {
  std::size_t w = 0;
  for (int k = 0; k < chunks; ++k) w += ramp_weight(chunks, k);
  return w;
}

/// A half-open element range [begin, begin + count).
struct range {
  std::size_t begin = 0;
  std::size_t count = 0;
  std::size_t end() const { return begin + count; }
};

/// Part `i` of `n` blocks dealt out evenly over `parts` (the first n % parts get one more).
inline range split_blocks(std::size_t n, std::size_t parts, std::size_t i) {
  const std::size_t base = n / parts, rem = n % parts;
  const std::size_t begin = i * base + std::min(i, rem);
  return {begin, base + (i < rem ? 1 : 0)};
}

/// Element range of the blocks [b.begin, b.end()) of a tensor of `count` elements.
inline range blocks_to_elements(range b, std::size_t block, std::size_t count) {
  const std::size_t first = std::min(b.begin * block, count);
  const std::size_t last = std::min(b.end() * block, count);
  return {first, last - first};
}

/// Shard `rank` of `ranks` of a tensor of `count` elements cut in blocks of `block`.
inline range shard(std::size_t count, std::size_t block, int ranks, int rank) {
  const std::size_t nblocks = (count + block - 1) / block;
  return blocks_to_elements(
      split_blocks(nblocks, static_cast<std::size_t>(ranks), static_cast<std::size_t>(rank)), block,
      count);
}

/// Every rank's whole shard as one range (indices from the shard's start): the ranges of a
/// call that moves whole shards, for code that also moves pieces of them chunk by chunk
/// (f(range) is called for each non-empty shard p of ranges(p, f)).
struct whole_shards {
  std::size_t count, block;
  int ranks;
  template <class F>
  void operator()(int p, F&& f) const {
    const range s = shard(count, block, ranks, p);
    if (s.count > 0) f(range{0, s.count});
  }
};

/// The size every shard has when all `ranks` shards are equal (one rank, or count a
/// multiple of ranks * block), else 0: then the shards are the contiguous, equal parts
/// that NCCL's own reduce_scatter and all_gather use.
inline std::size_t equal_shard(std::size_t count, std::size_t block, int ranks) {
  if (ranks == 1) return count;
  const std::size_t per_rank = block * static_cast<std::size_t>(ranks);
  return count % per_rank == 0 ? count / static_cast<std::size_t>(ranks) : 0;
}

/// How many chunks Schedule cuts `count` elements into (blocks of `block`, `ranks`
/// ranks): at most Schedule::max_chunks and at least 1. Equal chunks: no more than the
/// smallest shard's blocks, nor than count / Schedule::min_chunk_values. Ramped chunks:
/// the lightest chunk of a rank's share keeps a block and min_piece_values values.
template <class Schedule>
int num_chunks(std::size_t count, std::size_t block, int ranks) {
  const std::size_t nblocks = (count + block - 1) / block;
  const std::size_t per_rank = nblocks / static_cast<std::size_t>(ranks);
  if constexpr (ramps_v<Schedule>) {
    // The most chunks whose lightest one keeps a block and min_piece_values values of
    // each rank's share.
    const std::size_t values = count / static_cast<std::size_t>(ranks);
    int k = 1;
    while (k < Schedule::max_chunks && ramp_total(k + 1) <= per_rank &&
           ramp_total(k + 1) * Schedule::min_piece_values <= values)
      ++k;
    return k;
  } else {
    const std::size_t by_size = count / Schedule::min_chunk_values;
    const std::size_t k = std::min<std::size_t>(std::min(per_rank, by_size),
                                                static_cast<std::size_t>(Schedule::max_chunks));
    return static_cast<int>(std::max<std::size_t>(1, k));
  }
}

/// Part `k` of `n` blocks cut into `chunks` parts in proportion to ramp_weight (each part
/// holds at least one block when n >= ramp_total(chunks)).
inline range ramp_blocks(std::size_t n, int chunks, int k) {
  const std::size_t total = ramp_total(chunks);
  std::size_t before = 0;
  for (int j = 0; j < k; ++j) before += ramp_weight(chunks, j);
  const std::size_t first = n * before / total;
  return {first, n * (before + ramp_weight(chunks, k)) / total - first};
}

/// Piece `k` of `chunks` of the shard `s` (s.begin a multiple of `block`) as Schedule cuts
/// it: whole blocks, in equal parts, or in proportion to ramp_weight for a ramped
/// schedule.
template <class Schedule>
range piece(range s, std::size_t block, int chunks, int k) {
  const std::size_t nblocks = (s.count + block - 1) / block;
  range b;
  if constexpr (ramps_v<Schedule>)
    b = ramp_blocks(nblocks, chunks, k);
  else
    b = split_blocks(nblocks, static_cast<std::size_t>(chunks), static_cast<std::size_t>(k));
  range r = blocks_to_elements(b, block, s.count);
  r.begin += s.begin;
  return r;
}

}  // namespace lowbit::schedule
