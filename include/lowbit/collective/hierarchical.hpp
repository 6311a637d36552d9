// lowbit::hierarchical_all_reduce and hierarchical_reduce_scatter: the low-bit collectives
// over two communicators, node-local (`intra`) and cross-node rails (`inter`), composed
// from the flat collectives; they move no byte of their own.
//
// all_reduce of a count-element tensor on N nodes of G ranks, this rank being local
// index l of node n:
//   1 intra  reduce-scatter: rank l gets shard l of the node's sum (whole blocks), at full
//            precision (full_precision) or at IntraCodec
//   2 inter  low-bit all_reduce of that shard over rail l (the ranks of index l on every
//            node): InterCodec, Feedback, stage 1 and stage 2 as in the flat all_reduce
//   3 intra  all-gather of the reduced shards
// Every rank's network link carries 1/G of the tensor, all rails at once. Every rank of a
// rail decodes the same frames (as in the flat all_reduce) and stage 3 gives every rank of a node
// the same shards, so all P = N*G ranks end with bitwise-identical outputs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "lowbit/collective/all_gather.hpp"
#include "lowbit/collective/all_reduce.hpp"
#include "lowbit/collective/detail/call_state.hpp"
#include "lowbit/collective/detail/hierarchical_stage.hpp"
#include "lowbit/collective/reduce_scatter.hpp"
#include "lowbit/collective/types.hpp"
#include "lowbit/schedule/schedule.hpp"

namespace lowbit {

namespace detail {

/// What both hierarchical collectives share: the intra stages, the per-call agreement
/// over both communicators, and the scratch shard between the stages. `Inter` is the flat
/// collective of stage 2 (all_reduce or reduce_scatter) on Backend; the node-local stages
/// run on IntraBackend. Where Backend runs on the host and IntraBackend on a stream
/// (staged_rail_v: MPI across, the node backend inside), stage 2's shard goes through
/// pinned host memory (rail_staging) and a call completes before it returns.
template <class T, class InterCodec, class IntraCodec, class Schedule, class Backend,
          class IntraBackend, class Inter>
class hierarchical_base {
 protected:
  using impl = backend_impl<Backend>;
  using intra_type = intra_stage<IntraBackend, Backend, T, IntraCodec, InterCodec, Schedule>;
  /// Stage 2 runs on the host, the node-local stages on a stream (rail()).
  static constexpr bool staged = staged_rail_v<IntraBackend, Backend>;
  /// A call of several chunks overlaps its stages (a full-precision node-local stage, and
  /// stage 2 on the stages' own stream or host).
  static constexpr bool pipelined = intra_type::chunked && !staged;

 public:
  using value_type = T;
  /// The rails' communicator (Backend's) and the node's (IntraBackend's).
  using comm_type = typename impl::comm_type;
  using intra_comm_type = typename intra_type::comm_type;
  /// What a call is ordered on: the node-local stages' (both backends' where they order
  /// work alike; the stream, where stage 2 is staged through the host).
  using stream_type = typename intra_type::stream_type;

  hierarchical_base(const hierarchical_base&) = delete;
  hierarchical_base& operator=(const hierarchical_base&) = delete;
  hierarchical_base(hierarchical_base&&) = default;
  hierarchical_base& operator=(hierarchical_base&&) = default;

  /// The largest count a call accepts.
  std::size_t max_count() const noexcept { return max_count_; }
  /// Nodes (ranks of `inter`) and ranks per node (ranks of `intra`).
  int nodes() const noexcept { return inter_.size(); }
  int ranks_per_node() const noexcept { return intra_.size(); }
  /// This rank's node and its index on the node.
  int node() const noexcept { return inter_.rank(); }
  int local_rank() const noexcept { return intra_.rank(); }
  /// The range of a count-element tensor this rank's rail reduces across nodes (stage 2).
  schedule::range rail_shard(std::size_t count) const { return intra_.shard(count); }
  /// The step the next call's stages use for stochastic rounding (each call adds one,
  /// also on a rank whose rail shard is empty, so that every rank keeps the same step).
  std::uint32_t step() const noexcept { return calls_.step(); }
  void set_step(std::uint32_t s) noexcept { calls_.set_step(s); }
  /// The options this object was built with (each stage runs a copy with a seed of its own,
  /// and without checked mode: the hierarchical agreement covers every stage).
  const collective_options& options() const noexcept { return opts_; }
  /// Zeroes stage 2's feedback state (no call in flight).
  void reset_feedback() { inter_.reset_feedback(); }
  /// Stage 2's feedback state: this rank's rail shard's, indexed from the shard's start.
  auto& feedback_state() noexcept { return inter_.feedback_state(); }
  /// Waits for this object's calls on `stream` (NCCL, node; a no-op on MPI) within
  /// options().timeout, polling both communicators' asynchronous errors: on an NCCL error
  /// or expiry both are aborted (whichever failed: the other's stages wait on it) and
  /// lowbit::nccl_error or lowbit::timeout_error thrown, as the flat collectives' sync()
  /// does with their one.
  /// A disagreement that a stage's kernels recorded in their frames' headers (they wrote
  /// nothing) raises lowbit::agreement_error, once, and retires this object.
  void sync(stream_type stream = {}) {
    calls_.guard([&] {
      detail::sync_both<IntraBackend, Backend>(intra_.intra_comm(), intra_.inter_comm(), stream,
                                               call_check(who_, calls_.last(), opts_.timeout, 0));
      intra_.raise_recorded_disagreement(who_);
      rail_engine().raise_recorded_disagreement(who_);
    });
  }

 protected:
  /// `rail_in_place`: stage 2 may write its input (all_reduce), so a staged stage 2 needs
  /// one host buffer, not two.
  hierarchical_base(const intra_comm_type& intra, const comm_type& inter, std::size_t max_count,
                    const collective_options& opts, const char* who, bool rail_in_place)
      : max_count_(max_count),
        who_(who),
        opts_(opts),
        intra_(intra, inter, max_count, opts, who),
        inter_(inter, intra_.largest_shard(max_count), intra_.rail_options(opts)),
        shard_(intra_.largest_shard(max_count)),
        staging_(intra_.largest_shard(max_count), rail_in_place),
        links_(Schedule::max_chunks),
        calls_(opts.first_step) {}

  /// Stage 2's engine (engine.hpp), which the pipelined path drives with links_.
  auto& rail_engine() noexcept { return engine_access::of(inter_); }
  const auto& rail_engine() const noexcept { return engine_access::of(inter_); }

  /// The chunks stage 2 cuts rank p's rail shard into (the same on every rank).
  int rail_chunks(std::size_t count, int p) const {
    return rail_engine().template chunks<InterCodec>(intra_.shard_of(count, p).count);
  }
  /// The chunks of a call: the most any rank's stage 2 runs; 1 (the stages one after the
  /// other) with a coded node-local stage, a staged stage 2 (which cuts its own chunks, on
  /// the host), or when no rank's stage 2 is cut.
  int chunks(std::size_t count) const {
    if constexpr (!pipelined) {
      return 1;
    } else {
      int K = 1;
      for (int p = 0; p < intra_.size(); ++p) K = std::max(K, rail_chunks(count, p));
      return K;
    }
  }

  /// Chunk k's pieces of every rank's rail shard: ranges(p, f) calls f with each range of
  /// p's shard (from its start) that p's stage 2 reads in chunk k, as the engine cuts it.
  struct chunk_ranges {
    const hierarchical_base* h;
    std::size_t count;
    int k;
    template <class F>
    void operator()(int p, F&& f) const {
      const std::size_t n = h->intra_.shard_of(count, p).count;
      const int K = h->rail_engine().template chunks<InterCodec>(n);
      if (k < K) h->rail_engine().template chunk_ranges<InterCodec>(n, K, k, f);
    }
  };

  /// Stage 1 of every chunk (caller's stream), then `rail(stage-2 stream)`, which issues
  /// stage 2 with links_ as its Links; the stage-2 stream is joined by the caller's at
  /// the end. Chunk k's stage 2 starts when its stage 1 is done, while stage 1 of chunk
  /// k+1 runs. Every input read (stage 1) is issued before any output write.
  template <class Rail>
  void pipeline_front(const T* in, std::size_t count, int K, stream_type stream, Rail&& rail) {
    const stream_type s2 = links_.begin(stream, true);
    for (int k = 0; k < K; ++k) {
      intra_.reduce_scatter(in, shard_.data(), count, chunk_ranges{this, count, k}, stream);
      links_.staged(k);
    }
    rail(s2);
  }

  /// Starts a call, before anything is enqueued or sent: every check a stage would make
  /// that can throw (a stage's collective checks again, but only once the stages before it
  /// are enqueued: a rank that threw there would leave its peers' earlier stages waiting
  /// for it); then checks that every rank's call is this one, over both communicators,
  /// before a byte of data moves (always on MPI, in checked mode on NCCL), and sets every
  /// stage's step.
  void begin_call(std::size_t count, stream_type stream) {
    calls_.require_usable(who_);
    intra_.precheck(who_);
    const std::size_t rail = intra_.shard(count).count;  // stage 2's count
    LOWBIT_EXPECTS(rail <= inter_.max_count(),
                   std::string(who_) + ": stage 2's count " + std::to_string(rail) +
                       " exceeds its max_count " + std::to_string(inter_.max_count()) +
                       " (a lowbit bug)");
    if (impl::host_frames || opts_.verify) {
      const std::uint32_t cfg = config_id<T, InterCodec, IntraCodec, Schedule, Inter>(
          fnv1a(who_) ^ (static_cast<std::uint32_t>(opts_.op) << 1));
      guarded(
          [&] {
            intra_.agree(cfg, count, calls_.step(), calls_.next_seq(), InterCodec::bits, stream);
          },
          /*retire_on_disagreement=*/false);
    }
    calls_.begin(count);
    inter_.set_step(calls_.step());
    intra_.set_step(calls_.step());
    calls_.advance_step();
  }

  /// Stage 2 of a call: the n values at `in` reduced across nodes into `out` (n_out values:
  /// n, or this rank's piece for a reduce-scatter), where the stages put them. Where stage 2
  /// is staged (staged_rail_v), the shard is copied to pinned host memory on the call's
  /// stream, the host waits for it as sync() does (within the deadline, watching the node's
  /// communicator: a failed stage 1 raises here, before a byte crosses nodes), stage 2 runs
  /// on the host, and its result is copied back on the stream, for stage 3 or the caller to
  /// read in stream order; nothing reaches `out` unless stage 2 completed.
  void rail(const T* in, T* out, std::size_t n, std::size_t n_out, stream_type stream) {
    if constexpr (!staged) {
      detail::issue_call<Backend>(inter_, in, out, n, stream);
    } else {
      T* host = staging_.to_host(in, n, stream);
      sync(stream);
      inter_(host, staging_.result(), n);
      staging_.to_device(out, n_out, stream);
    }
  }

  /// Runs `f` (a call's agreement or its stages): a timeout or a communicator's error
  /// poisons both communicators (one failed, and the other's stages of this call would
  /// wait on it); a disagreement that the frames of a stage showed, after the agreement
  /// passed, retires this object as the flat collectives retire theirs (its stages'
  /// channels may hold stray frames).
  template <class F>
  void guarded(F&& f, bool retire_on_disagreement = true) {
    try {
      f();
    } catch (const agreement_error& e) {
      if (retire_on_disagreement) calls_.retire(e.what());
      throw;
    } catch (const timeout_error& e) {
      intra_.poison(e.what());
      throw;
    } catch (const coded_error& e) {  // nccl_error, mpi_error, cuda_error
      intra_.poison(e.what());
      throw;
    }
  }

  std::size_t max_count_;
  const char* who_;
  collective_options opts_;
  intra_type intra_;
  Inter inter_;
  /// This rank's rail shard between the stages (IntraBackend's memory, which both backends
  /// reach where they order work alike; else staging_ carries it to the host and back).
  typename backend_impl<IntraBackend>::template buffer<T> shard_;
  struct no_staging {
    no_staging(std::size_t, bool) {}
  };
  std::conditional_t<staged, rail_staging<stream_type, T>, no_staging> staging_;
  stage_links<stream_type> links_;  ///< how the pipelined stages wait for each other
  call_state calls_;                ///< call numbers, steps, retirement
};

}  // namespace detail

/// A low-bit all-reduce over N nodes of G ranks: intra-node reduce-scatter (full precision
/// by default, or at IntraCodec), a flat lowbit::all_reduce of each rank's 1/G shard over
/// its rail at InterCodec with Feedback (one object, so its feedback state belongs to the
/// shard), and an intra-node all-gather (file comment). The network carries 1/G of the
/// flat all-reduce's frames per rank, every rail at once, where a leader-based scheme
/// would send them all through one link per node.
///
/// `intra` holds this node's ranks, `inter` this rank's rail; comm::split_by_node makes
/// both from one communicator (or, for the node backend inside a node, node_comm_from_mpi
/// of the node's MPI communicator). Both are borrowed: they must outlive the collective, and
/// every node must hold the same number of ranks (checked at construction, on every
/// rank). Every rank calls with the same count, in the same order; on the MPI backend
/// (and in checked mode on NCCL) each call first exchanges a 32-byte fingerprint over
/// `intra`, then the verdicts over `inter`, so that a disagreement anywhere raises
/// lowbit::agreement_error on every rank before data moves; every wait has
/// collective_options::timeout, as in the stages. Any count, including counts that leave
/// some shards empty. Stochastic rounding of stage 2 is keyed by (seed, step, node,
/// index in the shard) with a seed drawn from options.seed and the rail, so rails do not
/// share noise. A call of several chunks (Schedule's chunks of stage 2) pipelines the
/// stages: chunk k's stage 2, on a stream of this object forked from the caller's, overlaps
/// stage 1 of the later chunks and stage 3 of the earlier ones (the caller's stream runs
/// every chunk's stage 1, then every chunk's stage 3), linked by events only
/// (graph-capturable), computing the bits of a one-pass call
/// (docs/multi-node.md, "Pipelining"); the MPI backend runs the same chunks in turn.
/// Move-only.
///
/// Backend carries stage 2 (the rails, across nodes); IntraBackend the node-local stages
/// (Backend by default): one backend for both, backend::node inside a node with
/// backend::nccl across, or backend::node inside with backend::mpi across. In the last
/// pairing the tensors are device memory and stage 2 is the host backend's: each call
/// copies its rail shard to pinned host memory and back on `stream`, waits for its stream,
/// and computes the bits of mpi::hierarchical_all_reduce; operator() returns when `out`
/// holds the result, and async() does not exist.
template <class T, class InterCodec, class Feedback = feedback::none,
          class IntraCodec = full_precision, class Schedule = schedule::default_schedule,
          class Backend = backend::nccl, class IntraBackend = Backend>
class hierarchical_all_reduce
    : public detail::hierarchical_base<T, InterCodec, IntraCodec, Schedule, Backend, IntraBackend,
                                       all_reduce<T, InterCodec, Feedback, Schedule, Backend>> {
  using base = detail::hierarchical_base<T, InterCodec, IntraCodec, Schedule, Backend, IntraBackend,
                                         all_reduce<T, InterCodec, Feedback, Schedule, Backend>>;

 public:
  using typename base::comm_type;
  using typename base::intra_comm_type;
  using typename base::stream_type;

  /// Builds the three stages for tensors of up to max_count values (collective over both
  /// communicators). `opts` applies to every stage: op (avg divides by G in stage 1 and
  /// by N in stage 2), seed, algorithm of stage 2, timeout, verify.
  hierarchical_all_reduce(const intra_comm_type& intra, const comm_type& inter,
                          std::size_t max_count, const collective_options& opts = {})
      : base(intra, inter, max_count, opts, "lowbit::hierarchical_all_reduce", true) {}
  /// Refused: the collective keeps pointers to the communicators.
  hierarchical_all_reduce(const intra_comm_type&&, const comm_type&, std::size_t,
                          const collective_options& = {}) = delete;
  hierarchical_all_reduce(const intra_comm_type&, const comm_type&&, std::size_t,
                          const collective_options& = {}) = delete;

  /// Reduces in[0, count) over every rank of every node into out[0, count) (in == out
  /// allowed); returns when `out` holds the result (NCCL: within options().timeout).
  void operator()(const T* in, T* out, std::size_t count, stream_type stream = {}) {
    run(in, out, count, stream);
    this->sync(stream);
  }
  /// The same, enqueued on `stream` (NCCL, node); in checked mode it synchronises.
  void async(const T* in, T* out, std::size_t count, stream_type stream) {
    static_assert(stream_ordered_v<Backend> && stream_ordered_v<IntraBackend>,
                  "lowbit: async() exists where both backends are stream-ordered (NCCL, node) "
                  "only; with MPI across nodes a call runs stage 2 on the host: use operator()");
    run(in, out, count, stream);
  }
  /// Stage 2's algorithm (one_shot on two nodes by default).
  all_reduce_algorithm algorithm() const noexcept { return this->inter_.algorithm(); }

 private:
  void run(const T* in, T* out, std::size_t count, stream_type stream) {
    this->intra_.validate(in, out, count, this->max_count_);
    if (count == 0) return;
    this->begin_call(count, stream);
    this->guarded([&] { stages(in, out, count, stream); });
  }

  void stages(const T* in, T* out, std::size_t count, stream_type stream) {
    if (this->ranks_per_node() == 1)  // stage 1 and 3 are copies: stage 2 alone
      return this->rail(in, out, count, count, stream);
    const schedule::range mine = this->intra_.shard(count);
    T* shard = this->shard_.data();
    const int K = this->chunks(count);
    if (K == 1) {
      this->intra_.reduce_scatter(in, shard, count, stream);
      this->rail(shard, shard, mine.count, mine.count, stream);
      this->intra_.all_gather(shard, out, count, stream);
      return;
    }
    if constexpr (base::pipelined) {
      this->pipeline_front(in, count, K, stream, [&](stream_type s2) {
        this->rail_engine().template all_reduce<InterCodec>(shard, shard, mine.count, s2,
                                                            "lowbit::all_reduce", this->links_);
      });
      const int mine_chunks = this->rail_chunks(count, this->local_rank());
      for (int k = 0; k < K; ++k) {  // stage 3 of chunk k once its stage 2 is done
        if (k < mine_chunks) this->links_.before_gather(k);
        this->intra_.all_gather(shard, out, count, typename base::chunk_ranges{this, count, k},
                                stream);
      }
      this->links_.end();
    }
  }
};

/// A low-bit reduce-scatter over N nodes of G ranks: stage 1 as hierarchical_all_reduce,
/// then a flat lowbit::reduce_scatter of the rail shard at InterCodec with Feedback (one
/// quantization across nodes). Rank (node n, local l) gets piece n of rail shard l:
/// `shard(count)`, a contiguous range; the pieces are ordered local index first, node
/// second (not by the parent communicator's ranks). Same communicators, agreement,
/// deadlines and lifetime rules as hierarchical_all_reduce.
template <class T, class InterCodec, class Feedback = feedback::none,
          class IntraCodec = full_precision, class Schedule = schedule::default_schedule,
          class Backend = backend::nccl, class IntraBackend = Backend>
class hierarchical_reduce_scatter
    : public detail::hierarchical_base<T, InterCodec, IntraCodec, Schedule, Backend, IntraBackend,
                                       reduce_scatter<T, InterCodec, Feedback, Schedule, Backend>> {
  using base =
      detail::hierarchical_base<T, InterCodec, IntraCodec, Schedule, Backend, IntraBackend,
                                reduce_scatter<T, InterCodec, Feedback, Schedule, Backend>>;

 public:
  using typename base::comm_type;
  using typename base::intra_comm_type;
  using typename base::stream_type;

  hierarchical_reduce_scatter(const intra_comm_type& intra, const comm_type& inter,
                              std::size_t max_count, const collective_options& opts = {})
      : base(intra, inter, max_count, opts, "lowbit::hierarchical_reduce_scatter", false) {}
  hierarchical_reduce_scatter(const intra_comm_type&&, const comm_type&, std::size_t,
                              const collective_options& = {}) = delete;
  hierarchical_reduce_scatter(const intra_comm_type&, const comm_type&&, std::size_t,
                              const collective_options& = {}) = delete;

  /// This rank's part of a count-element tensor: what a call writes to `out`.
  schedule::range shard(std::size_t count) const {
    const schedule::range rail = this->rail_shard(count);
    const schedule::range piece = this->inter_.shard(rail.count);
    return {rail.begin + piece.begin, piece.count};
  }

  /// Reduces in[0, count) over every rank; out[0, shard(count).count) gets this rank's
  /// part. `out` must not overlap `in`. Returns when `out` holds it.
  void operator()(const T* in, T* out, std::size_t count, stream_type stream = {}) {
    run(in, out, count, stream);
    this->sync(stream);
  }
  /// The same, enqueued on `stream` (NCCL, node).
  void async(const T* in, T* out, std::size_t count, stream_type stream) {
    static_assert(stream_ordered_v<Backend> && stream_ordered_v<IntraBackend>,
                  "lowbit: async() exists where both backends are stream-ordered (NCCL, node) "
                  "only; with MPI across nodes a call runs stage 2 on the host: use operator()");
    run(in, out, count, stream);
  }

 private:
  void run(const T* in, T* out, std::size_t count, stream_type stream) {
    this->intra_.validate(in, shard(count).count > 0 ? out : in, count, this->max_count_);
    if (count == 0) return;
    this->begin_call(count, stream);
    this->guarded([&] { stages(in, out, count, stream); });
  }

  void stages(const T* in, T* out, std::size_t count, stream_type stream) {
    if (this->ranks_per_node() == 1)  // stage 1 is a copy: stage 2 alone
      return this->rail(in, out, count, this->shard(count).count, stream);
    const schedule::range rail = this->rail_shard(count);
    T* shard = this->shard_.data();
    const int K = this->chunks(count);
    if (K == 1) {
      this->intra_.reduce_scatter(in, shard, count, stream);
      this->rail(shard, out, rail.count, this->shard(count).count, stream);
      return;
    }
    if constexpr (base::pipelined) {
      this->pipeline_front(in, count, K, stream, [&](stream_type s2) {
        this->rail_engine().template reduce_scatter<InterCodec>(
            shard, out, rail.count, s2, "lowbit::reduce_scatter", this->links_);
      });
      this->links_.end();
    }
  }
};

}  // namespace lowbit
