// The node-local stage of the hierarchical collectives (collective/hierarchical.hpp):
// reduce-scatter and all-gather over `intra`, at full precision or at a codec, and the
// per-call agreement over both communicators, which may belong to two backends (the node
// backend inside a node, NCCL or MPI across). The full-precision stage is the node-local
// backend's (full_precision_stage, specialised in hierarchical_mpi.hpp,
// hierarchical_nccl.cuh and hierarchical_node.cuh).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "lowbit/collective/all_gather.hpp"
#include "lowbit/collective/detail/agreement.hpp"
#include "lowbit/collective/detail/call_state.hpp"
#include "lowbit/collective/detail/engine.hpp"
#include "lowbit/collective/reduce_scatter.hpp"
#include "lowbit/collective/types.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/schedule/schedule.hpp"

namespace lowbit {

/// IntraCodec of a hierarchical collective: the node-local stages move the values
/// themselves (no quantization). On NCCL they are NCCL's reduce-scatter and all-gather;
/// on the MPI backend a rank-order fp32 sum of frames holding the raw values.
struct full_precision {
  static constexpr int bits = 32;
  static constexpr const char* name = "full_precision";
};

namespace detail {

/// The full-precision node-local stage of a backend; the specialisations live with the
/// backends (hierarchical_mpi.hpp, hierarchical_nccl.cuh, hierarchical_node.cuh).
template <class Backend, class T>
class full_precision_stage {
  static_assert(dependent_false<Backend>,
                "lowbit: no full-precision hierarchical stage for this backend: include "
                "lowbit/collective/mpi.hpp, lowbit/collective/nccl.cuh or "
                "lowbit/collective/node.cuh");
};

/// The calls of a full-precision node-local stage that moves frames of its own (the MPI
/// and node backends'): each stage call (stage 1 or 3, or a chunk of one) is numbered in a
/// call_state, and every frame of it carries the header begin() returns.
class stage_calls {
 public:
  stage_calls(const char* who, std::chrono::milliseconds timeout, int ranks, int rank)
      : who_(who), timeout_(timeout), ranks_(ranks), rank_(rank) {}

  /// The next call's expected header: `Stage` and `what` name the stage (config), with the
  /// count and this stage's call number.
  template <class T, class Stage>
  call_check begin(std::size_t count, const char* what) {
    frame_header h;
    h.magic = frame_magic;
    h.config = config_id<T, Stage>(fnv1a(what));
    h.count = count;
    h.seq = calls_.begin(count);
    h.bits = 32;
    h.rank = static_cast<std::uint32_t>(rank_);
    return call_check(who_, h, timeout_, ranks_);
  }

 private:
  const char* who_;
  std::chrono::milliseconds timeout_;
  int ranks_, rank_;
  call_state calls_;
};

/// The values rank p's pieces hold: the sum of the ranges ranges(p, f) names.
template <class Ranges>
std::size_t values_of(const Ranges& ranges, int p) {
  std::size_t n = 0;
  ranges(p, [&](schedule::range r) { n += r.count; });
  return n;
}

/// How a hierarchical call's chunked stages wait for each other, by what orders the work
/// (the backends' stream_type): events between two CUDA streams
/// (hierarchical_device.cuh), nothing on the host backend (hierarchical_mpi.hpp).
template <class Stream>
class stage_links {
  static_assert(dependent_false<Stream>,
                "lowbit: no hierarchical stage links for this backend: include "
                "lowbit/collective/mpi.hpp, lowbit/collective/nccl.cuh or "
                "lowbit/collective/node.cuh");
};

/// How a hierarchical call waits for its work over both of its communicators, by what
/// orders the work (specialised beside stage_links):
///   template <class IntraB, class InterB> static void wait(intra, inter, stream,
///     const call_check&): waits for the call's work on `stream` within the deadline,
///     watching both communicators for a failure the stream cannot report, and on a failure
///     or expiry poisons both and throws.
template <class Stream>
struct stage_sync {
  static_assert(dependent_false<Stream>,
                "lowbit: no hierarchical stage sync for this backend: include "
                "lowbit/collective/mpi.hpp, lowbit/collective/nccl.cuh or "
                "lowbit/collective/node.cuh");
};

/// After a timeout or a communicator's error anywhere in a hierarchical call: both
/// communicators are unusable (MPI) or aborted (NCCL, node), whichever one failed (the
/// other's stages of the call would wait on it).
template <class IntraB, class InterB, class IntraComm, class InterComm>
void poison_both(const IntraComm& intra, const InterComm& inter, const std::string& why) noexcept {
  backend_impl<IntraB>::poison(intra, why);
  backend_impl<InterB>::poison(inter, why);
}

/// Waits for a hierarchical call's work within cc.timeout, watching both communicators (a
/// no-op on the host backend, whose calls complete before they return).
template <class IntraB, class InterB, class IntraComm, class InterComm, class Stream>
void sync_both(const IntraComm& intra, const InterComm& inter, Stream stream,
               const call_check& cc) {
  stage_sync<Stream>::template wait<IntraB, InterB>(intra, inter, stream, cc);
}

/// True when a hierarchical collective's stage 2 runs on the host (its backend is not
/// stream-ordered: MPI) under node-local stages on a stream (the node backend, NCCL): the
/// stages' data lives in device memory, so stage 2's shard is staged through host memory
/// (rail_staging), and a call completes before it returns.
template <class IntraB, class InterB>
inline constexpr bool staged_rail_v = stream_ordered_v<IntraB> && !stream_ordered_v<InterB>;

/// The host copy of a rail shard between stream-ordered node-local stages and a host
/// stage 2 (staged_rail_v), by what orders the node's work (specialised beside stage_sync):
///   rail_staging(std::size_t values, bool in_place): host buffers for stage 2's input and
///     output of up to `values` each (one, shared, when `in_place`), allocated once;
///   T* to_host(const T* from, std::size_t n, Stream): enqueues the copy of n values of
///     `from` into the input buffer and returns it (valid once the stream is waited for);
///   T* result(): the output buffer (the input one when in_place);
///   void to_device(T* to, std::size_t n, Stream): enqueues the copy of the output's first
///     n values to `to`.
template <class Stream, class T>
class rail_staging {
  static_assert(dependent_false<Stream>,
                "lowbit: no host staging of the cross-node stage for this backend: include "
                "lowbit/collective/node.cuh or lowbit/collective/nccl.cuh");
};

/// Runs a call of a flat collective with the backend's entry point: async where calls are
/// stream-ordered (the hierarchical call synchronises once, at its end), else a completed
/// call.
template <class Backend, class C, class In, class Out, class Stream>
void issue_call(C& c, In in, Out out, std::size_t count, Stream stream) {
  if constexpr (stream_ordered_v<Backend>)
    c.async(in, out, count, stream);
  else
    c(in, out, count, stream);
}

/// Small all-gathers over one communicator (checked mode's fingerprint exchange), within a
/// deadline: how a hierarchical call checks its ranks' agreement.
template <class Backend>
class side_channel {
  using impl = backend_impl<Backend>;

 public:
  using comm_type = typename impl::comm_type;
  using stream_type = typename impl::stream_type;

  explicit side_channel(const comm_type& comm) : be_(comm, 0, 1), size_(comm.size()) {}

  /// Every rank's `bytes` at `mine`, rank by rank; valid until the next exchange.
  const std::byte* exchange(const void* mine, std::size_t bytes, stream_type stream,
                            std::chrono::milliseconds timeout, const char* who) {
    be_.set_check_stream(stream);
    call_check cc(who, frame_header{}, timeout, size_);
    return be_.allgather_small(mine, bytes, cc);
  }
  impl& backend() noexcept { return be_; }

 private:
  impl be_;
  int size_;
};

/// Stage 1 and 3 of a hierarchical collective (over `intra`, a communicator of IntraB) and
/// its agreement (over both; `inter` is InterB's).
template <class IntraB, class InterB, class T, class IntraCodec, class InterCodec, class Schedule>
class intra_stage {
  using impl = backend_impl<IntraB>;
  using inter_impl = backend_impl<InterB>;
  static_assert(std::is_same_v<typename impl::stream_type, typename inter_impl::stream_type> ||
                    staged_rail_v<IntraB, InterB>,
                "lowbit: the node-local and cross-node backends of a hierarchical collective "
                "must order their work alike (both on CUDA streams: nccl and node; or both on "
                "the host: mpi), or run the node-local stages on a CUDA stream and the "
                "cross-node stage on the host (node inside, mpi across); a host node-local "
                "stage under a stream-ordered cross-node one is not supported");
  static constexpr bool full = std::is_same_v<IntraCodec, full_precision>;
  /// Stage 1's shards are whole blocks of the codec that cuts them: stage 2's at full
  /// precision, so that a rail shard is whole stage-2 blocks too.
  static constexpr std::size_t block = [] {
    if constexpr (full)
      return std::size_t(InterCodec::block_size);
    else
      return std::size_t(IntraCodec::block_size);
  }();
  struct coded {
    ::lowbit::reduce_scatter<T, IntraCodec, feedback::none, Schedule, IntraB> rs;
    ::lowbit::all_gather<T, IntraCodec, Schedule, IntraB> ag;
  };
  using stages = std::conditional_t<full, full_precision_stage<IntraB, T>, coded>;

 public:
  using comm_type = typename impl::comm_type;
  using inter_comm_type = typename inter_impl::comm_type;
  using stream_type = typename impl::stream_type;

  /// Collective over both communicators: checks that every node holds the same number of
  /// ranks (lowbit::invalid_argument on every rank otherwise), then builds the stages.
  intra_stage(const comm_type& intra, const inter_comm_type& inter, std::size_t max_count,
              const collective_options& opts, const char* who)
      : who_(who),
        opts_(opts),
        G_(checked(intra, who).size()),
        l_(intra.rank()),
        n_(checked_inter(inter, who).rank()),
        intra_comm_(&intra),
        inter_comm_(&inter),
        intra_ch_(intra),
        inter_ch_(inter),
        stages_(make_stages(intra, max_count)) {
    check_shape(intra.size(), inter.size());
  }

  int size() const noexcept { return G_; }
  int rank() const noexcept { return l_; }
  /// This rank's rail shard of a count-element tensor, and rank p's.
  schedule::range shard(std::size_t count) const { return schedule::shard(count, block, G_, l_); }
  schedule::range shard_of(std::size_t count, int p) const {
    return schedule::shard(count, block, G_, p);
  }
  /// The most values any rank's rail shard holds for any count up to max_count: rank 0's
  /// at max_count (whole blocks are dealt with the remainder to the first ranks, so a
  /// rank's shard can grow as the count shrinks: buffers are sized by this, not by
  /// shard(max_count)).
  std::size_t largest_shard(std::size_t max_count) const {
    return schedule::shard(max_count, block, G_, 0).count;
  }
  /// Whether stage 1 and 3 can run chunk by chunk (the full-precision stage: a coded stage
  /// is a flat collective over the whole tensor, whose shards are contiguous).
  static constexpr bool chunked = full;

  /// Stage 2's options: the caller's, with a seed of this rail's own and without checked
  /// mode: agree() checks every stage's call before the first is enqueued, where stage 2's
  /// own fingerprint exchange would run after stage 1 is (and, on NCCL, wait for it
  /// watching the rail alone).
  collective_options rail_options(const collective_options& o) const {
    collective_options r = o;
    r.seed = mix_seed(o.seed, 2, static_cast<std::uint64_t>(l_));
    r.verify = false;
    return r;
  }

  void set_step(std::uint32_t s) noexcept {
    if constexpr (!full) {
      stages_.rs.set_step(s);
      stages_.ag.set_step(s);
    }
  }

  /// A call's preconditions, before anything moves (the stages check again).
  void validate(const void* in, const void* out, std::size_t count, std::size_t max_count) const {
    LOWBIT_EXPECTS(count <= max_count, std::string(who_) + ": count " + std::to_string(count) +
                                           " exceeds the max_count " + std::to_string(max_count) +
                                           " this object was built for");
    LOWBIT_EXPECTS(count == 0 || (in != nullptr && out != nullptr),
                   std::string(who_) + ": a buffer pointer is null");
  }

  /// The checks of a call that can throw, beyond validate(), run before anything is
  /// enqueued or sent: both communicators usable (not empty, aborted, marked unusable, nor
  /// holding an NCCL asynchronous error). Every stage's collective checks its communicator
  /// again, but only once the stages before it are enqueued: a rank that threw there would
  /// leave its peers' earlier stages waiting for it.
  void precheck(const char* who) const {
    impl::check_comm(*intra_comm_, who);
    inter_impl::check_comm(*inter_comm_, who);
  }

  /// After a timeout or a communicator's error anywhere in a call: both communicators are
  /// unusable (MPI) or aborted (NCCL), whichever one failed.
  void poison(const std::string& why) const noexcept {
    poison_both<IntraB, InterB>(*intra_comm_, *inter_comm_, why);
  }
  const comm_type& intra_comm() const noexcept { return *intra_comm_; }
  const inter_comm_type& inter_comm() const noexcept { return *inter_comm_; }

  /// A disagreement that stage 1's or 3's kernels recorded in their frames' headers (device
  /// backends; they wrote nothing): raised once as lowbit::agreement_error, which retires
  /// the collective.
  void raise_recorded_disagreement(const char* who) {
    if constexpr (full) {
      if constexpr (has_recorded_disagreement<stages>::value)
        stages_.raise_recorded_disagreement(who);
    } else {
      engine_access::of(stages_.rs).raise_recorded_disagreement(who);
      engine_access::of(stages_.ag).raise_recorded_disagreement(who);
    }
  }

  /// Every rank's call is this one: a header over `intra`, then each rank's header and
  /// verdict over `inter`. The second exchange carries every node's verdict to every
  /// rail, so all ranks reach the same verdict: any disagreement raises
  /// lowbit::agreement_error on every rank, before data moves.
  void agree(std::uint32_t config, std::size_t count, std::uint32_t step, std::uint32_t seq,
             int bits, stream_type stream) {
    frame_header h;
    h.magic = frame_magic;
    h.config = config;
    h.count = count;
    h.step = step;
    h.seq = seq;
    h.bits = static_cast<std::uint16_t>(bits);
    h.rank = static_cast<std::uint32_t>(l_);
    std::string why = first_mismatch(intra_ch_.exchange(&h, sizeof h, stream, opts_.timeout, who_),
                                     sizeof h, h, G_, l_, "node-local");
    verdict v;
    v.h = h;
    v.h.rank = static_cast<std::uint32_t>(n_);
    v.ok = why.empty() ? 1 : 0;
    const std::byte* all =
        inter_ch_.exchange(&v, sizeof v, inter_stream(stream), opts_.timeout, who_);
    const int N = static_cast<int>(inter_ch_size());
    for (int q = 0; q < N && why.empty(); ++q) {
      if (q == n_) continue;
      verdict o;
      std::memcpy(&o, all + static_cast<std::size_t>(q) * sizeof v, sizeof o);
      why = mismatch(o.h, v.h, q);
      if (!why.empty())
        why = "on the cross-node communicator, " + why;
      else if (!o.ok)
        why = "node " + std::to_string(q) + " found ranks that disagree";
    }
    if (!why.empty())
      throw agreement_error(__FILE__, __LINE__,
                            std::string(who_) + ": the ranks disagree: " + why +
                                "; no data was sent and nothing written");
  }

  /// Stage 1: out[0, shard(count).count) = this node's sum (times 1/G for avg) of shard l.
  void reduce_scatter(const T* in, T* out, std::size_t count, stream_type stream) {
    if constexpr (full)
      stages_.reduce_scatter(in, out, count, block, opts_.op, stream);
    else
      issue_call<IntraB>(stages_.rs, in, out, count, stream);
  }
  /// Stage 3: every rank's shard of `in` into out[0, count).
  void all_gather(const T* in, T* out, std::size_t count, stream_type stream) {
    if constexpr (full)
      stages_.all_gather(in, out, count, block, stream);
    else
      issue_call<IntraB>(stages_.ag, in, out, count, stream);
  }
  /// One chunk of stage 1 (full precision only): the pieces ranges(p, f) names of every
  /// rank p's shard (indices from the shard's start); out is this rank's shard.
  template <class Ranges>
  void reduce_scatter(const T* in, T* out, std::size_t count, const Ranges& ranges,
                      stream_type stream) {
    static_assert(full, "lowbit: a coded node-local stage runs whole");
    stages_.reduce_scatter(in, out, count, block, opts_.op, ranges, stream);
  }
  /// One chunk of stage 3 (full precision only): those pieces into place in out[0, count).
  template <class Ranges>
  void all_gather(const T* in, T* out, std::size_t count, const Ranges& ranges,
                  stream_type stream) {
    static_assert(full, "lowbit: a coded node-local stage runs whole");
    stages_.all_gather(in, out, count, block, ranges, stream);
  }

 private:
  struct verdict {
    frame_header h;
    std::uint32_t ok = 0;
    std::uint32_t pad[7] = {};
  };

  static const comm_type& checked(const comm_type& c, const char* who) {
    impl::check_comm(c, who);
    return c;
  }
  static const inter_comm_type& checked_inter(const inter_comm_type& c, const char* who) {
    inter_impl::check_comm(c, who);
    return c;
  }
  /// Whether a full-precision stage checks frame headers of its own (the node backend's).
  template <class S, class = void>
  struct has_recorded_disagreement : std::false_type {};
  template <class S>
  struct has_recorded_disagreement<
      S, std::void_t<decltype(std::declval<S&>().raise_recorded_disagreement(""))>>
      : std::true_type {};

  std::size_t inter_ch_size() const noexcept { return inter_size_; }
  /// What orders the rail's exchanges: the caller's stream, or nothing where stage 2 runs
  /// on the host (staged_rail_v).
  static typename inter_impl::stream_type inter_stream(stream_type s) {
    if constexpr (std::is_same_v<stream_type, typename inter_impl::stream_type>)
      return s;
    else
      return {};
  }

  static std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t stage, std::uint64_t key) {
    return seed ^ ((stage * 0x9e3779b97f4a7c15ull) + (key + 1) * 0xbf58476d1ce4e5b9ull);
  }

  stages make_stages(const comm_type& intra, std::size_t max_count) {
    if constexpr (full) {
      return stages(intra, max_count, block, opts_, who_);
    } else {
      // Stage 1's noise is keyed by the node as well, so nodes do not share it. Stage 3
      // re-encodes the rail's result, the same bits on every node, so its noise must be
      // the same on every node too: else nodes would end with different outputs.
      // Neither runs checked mode: agree() covers them, before stage 1 (rail_options).
      collective_options rs = opts_, ag = opts_;
      rs.seed = mix_seed(opts_.seed, 1, static_cast<std::uint64_t>(n_));
      ag.seed = mix_seed(opts_.seed, 3, 0);
      rs.verify = ag.verify = false;
      return coded{{intra, max_count, rs}, {intra, max_count, ag}};
    }
  }

  /// Every rank's node size over `inter` and rail size over `intra`: a rank whose rail
  /// spans nodes of several sizes, or whose node spans rails of several sizes, sees it,
  /// and with unequal nodes every rank is such a rank.
  void check_shape(int intra_size, int inter_size) {
    inter_size_ = static_cast<std::size_t>(inter_size);
    const std::int64_t mine[2] = {intra_size, inter_size};
    std::string why;
    const std::byte* a = intra_ch_.exchange(mine, sizeof mine, stream_type{}, opts_.timeout, who_);
    for (int p = 0; p < G_; ++p) {
      std::int64_t o[2];
      std::memcpy(o, a + static_cast<std::size_t>(p) * sizeof mine, sizeof o);
      if (o[1] != inter_size && why.empty())
        why = "the rails of this node hold " + std::to_string(o[1]) + " and " +
              std::to_string(inter_size) + " ranks";
    }
    const std::byte* b =
        inter_ch_.exchange(mine, sizeof mine, inter_stream(stream_type{}), opts_.timeout, who_);
    for (int q = 0; q < inter_size; ++q) {
      std::int64_t o[2];
      std::memcpy(o, b + static_cast<std::size_t>(q) * sizeof mine, sizeof o);
      if (o[0] != intra_size && why.empty())
        why = "the nodes of this rail hold " + std::to_string(o[0]) + " and " +
              std::to_string(intra_size) + " ranks";
    }
    LOWBIT_EXPECTS(why.empty(), std::string(who_) +
                                    ": every node must hold the same number of "
                                    "ranks, and every rail one rank per node: " +
                                    why);
  }

  static std::string first_mismatch(const std::byte* all, std::size_t bytes, const frame_header& h,
                                    int ranks, int me, const char* where) {
    for (int p = 0; p < ranks; ++p) {
      if (p == me) continue;
      const std::string why =
          mismatch(load_header(all + static_cast<std::size_t>(p) * bytes), h, p);
      if (!why.empty()) return std::string("on the ") + where + " communicator, " + why;
    }
    return {};
  }

  const char* who_;
  collective_options opts_;
  int G_, l_, n_;
  const comm_type* intra_comm_;
  const inter_comm_type* inter_comm_;
  std::size_t inter_size_ = 0;
  side_channel<IntraB> intra_ch_;
  side_channel<InterB> inter_ch_;
  stages stages_;
};

}  // namespace detail
}  // namespace lowbit
