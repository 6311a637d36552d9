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
// rail decodes the same frames (flat invariant 2) and stage 3 gives every rank of a node
// the same shards, so all P = N*G ranks end with bitwise-identical outputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "lowbit/collective/all_gather.hpp"
#include "lowbit/collective/all_reduce.hpp"
#include "lowbit/collective/detail/hierarchical_stage.hpp"
#include "lowbit/collective/reduce_scatter.hpp"
#include "lowbit/collective/types.hpp"
#include "lowbit/schedule/schedule.hpp"

namespace lowbit {

namespace detail {

/// What both hierarchical collectives share: the intra stages, the per-call agreement
/// over both communicators, and the scratch shard between the stages. `Inter` is the flat
/// collective of stage 2 (all_reduce or reduce_scatter).
template <class T, class InterCodec, class IntraCodec, class Schedule, class Backend, class Inter>
class hierarchical_base {
  using impl = backend_impl<Backend>;
  using intra_type = intra_stage<Backend, T, IntraCodec, InterCodec, Schedule>;

 public:
  using value_type = T;
  using comm_type = typename impl::comm_type;
  using stream_type = typename impl::stream_type;

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
  std::uint32_t step() const noexcept { return step_; }
  void set_step(std::uint32_t s) noexcept { step_ = s; }
  const collective_options& options() const noexcept { return inter_.options(); }
  /// Zeroes stage 2's feedback state (no call in flight).
  void reset_feedback() { inter_.reset_feedback(); }
  /// Stage 2's feedback state: this rank's rail shard's, indexed from the shard's start.
  auto& feedback_state() noexcept { return inter_.feedback_state(); }
  /// Waits for this object's calls on `stream` (NCCL; a no-op on MPI) within
  /// options().timeout, as the flat collectives' sync().
  void sync(stream_type stream = {}) { inter_.sync(stream); }

 protected:
  static constexpr bool on_nccl = std::is_same_v<Backend, backend::nccl>;

  hierarchical_base(const comm_type& intra, const comm_type& inter, std::size_t max_count,
                    const collective_options& opts, const char* who)
      : max_count_(max_count),
        who_(who),
        intra_(intra, inter, max_count, opts, who),
        inter_(inter, intra_.shard(max_count).count, intra_.rail_options(opts)),
        shard_(intra_.shard(max_count).count),
        step_(opts.first_step) {}

  /// Starts a call: checks that every rank's call is this one, over both communicators,
  /// before a byte of data moves (always on MPI, in checked mode on NCCL), and sets every
  /// stage's step.
  void begin_call(std::size_t count, stream_type stream) {
    if (impl::header_bytes > 0 || inter_.options().verify) {
      const std::uint32_t cfg = config_id<T, InterCodec, IntraCodec, Schedule, Inter>(
          fnv1a(who_) ^ (static_cast<std::uint32_t>(inter_.options().op) << 1));
      intra_.agree(cfg, count, step_, seq_, InterCodec::bits, stream);
    }
    ++seq_;
    inter_.set_step(step_);
    intra_.set_step(step_);
    ++step_;
  }

  std::size_t max_count_;
  const char* who_;
  std::uint32_t seq_ = 0;  ///< calls made so far
  intra_type intra_;
  Inter inter_;
  typename impl::template buffer<T> shard_;  ///< this rank's rail shard between the stages
  std::uint32_t step_;
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
/// both from one communicator. Both are borrowed: they must outlive the collective, and
/// every node must hold the same number of ranks (checked at construction, on every
/// rank). Every rank calls with the same count, in the same order; on the MPI backend
/// (and in checked mode on NCCL) each call first exchanges a 32-byte fingerprint over
/// `intra`, then the verdicts over `inter`, so that a disagreement anywhere raises
/// lowbit::agreement_error on every rank before data moves; every wait has
/// collective_options::timeout, as in the stages. Any count, including counts that leave
/// some shards empty. Stochastic rounding of stage 2 is keyed by (seed, step, node,
/// index in the shard) with a seed drawn from options.seed and the rail, so rails do not
/// share noise. Stages run one after the other on the caller's stream (NCCL) or
/// thread (MPI); the chunks of Schedule pipeline within each stage. Move-only.
template <class T, class InterCodec, class Feedback = feedback::none,
          class IntraCodec = full_precision, class Schedule = schedule::default_schedule,
          class Backend = backend::nccl>
class hierarchical_all_reduce
    : public detail::hierarchical_base<T, InterCodec, IntraCodec, Schedule, Backend,
                                       all_reduce<T, InterCodec, Feedback, Schedule, Backend>> {
  using base = detail::hierarchical_base<T, InterCodec, IntraCodec, Schedule, Backend,
                                         all_reduce<T, InterCodec, Feedback, Schedule, Backend>>;

 public:
  using typename base::comm_type;
  using typename base::stream_type;

  /// Builds the three stages for tensors of up to max_count values (collective over both
  /// communicators). `opts` applies to every stage: op (avg divides by G in stage 1 and
  /// by N in stage 2), seed, algorithm of stage 2, timeout, verify.
  hierarchical_all_reduce(const comm_type& intra, const comm_type& inter, std::size_t max_count,
                          const collective_options& opts = {})
      : base(intra, inter, max_count, opts, "lowbit::hierarchical_all_reduce") {}
  /// Refused: the collective keeps pointers to the communicators.
  hierarchical_all_reduce(const comm_type&&, const comm_type&, std::size_t,
                          const collective_options& = {}) = delete;
  hierarchical_all_reduce(const comm_type&, const comm_type&&, std::size_t,
                          const collective_options& = {}) = delete;

  /// Reduces in[0, count) over every rank of every node into out[0, count) (in == out
  /// allowed); returns when `out` holds the result (NCCL: within options().timeout).
  void operator()(const T* in, T* out, std::size_t count, stream_type stream = {}) {
    run(in, out, count, stream);
    this->sync(stream);
  }
  /// The same, enqueued on `stream` (NCCL only); in checked mode it synchronises.
  void async(const T* in, T* out, std::size_t count, stream_type stream) {
    static_assert(base::on_nccl, "lowbit: async() exists on the NCCL backend only");
    run(in, out, count, stream);
  }
  /// Stage 2's algorithm (one_shot on two nodes by default).
  all_reduce_algorithm algorithm() const noexcept { return this->inter_.algorithm(); }

 private:
  void run(const T* in, T* out, std::size_t count, stream_type stream) {
    this->intra_.validate(in, out, count, this->max_count_);
    if (count == 0) return;
    this->begin_call(count, stream);
    const schedule::range mine = this->intra_.shard(count);
    this->intra_.reduce_scatter(in, this->shard_.data(), count, stream);
    detail::issue_call<Backend>(this->inter_, this->shard_.data(), this->shard_.data(), mine.count,
                                stream);
    this->intra_.all_gather(this->shard_.data(), out, count, stream);
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
          class Backend = backend::nccl>
class hierarchical_reduce_scatter
    : public detail::hierarchical_base<T, InterCodec, IntraCodec, Schedule, Backend,
                                       reduce_scatter<T, InterCodec, Feedback, Schedule, Backend>> {
  using base =
      detail::hierarchical_base<T, InterCodec, IntraCodec, Schedule, Backend,
                                reduce_scatter<T, InterCodec, Feedback, Schedule, Backend>>;

 public:
  using typename base::comm_type;
  using typename base::stream_type;

  hierarchical_reduce_scatter(const comm_type& intra, const comm_type& inter, std::size_t max_count,
                              const collective_options& opts = {})
      : base(intra, inter, max_count, opts, "lowbit::hierarchical_reduce_scatter") {}
  hierarchical_reduce_scatter(const comm_type&&, const comm_type&, std::size_t,
                              const collective_options& = {}) = delete;
  hierarchical_reduce_scatter(const comm_type&, const comm_type&&, std::size_t,
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
  /// The same, enqueued on `stream` (NCCL only).
  void async(const T* in, T* out, std::size_t count, stream_type stream) {
    static_assert(base::on_nccl, "lowbit: async() exists on the NCCL backend only");
    run(in, out, count, stream);
  }

 private:
  void run(const T* in, T* out, std::size_t count, stream_type stream) {
    this->intra_.validate(in, shard(count).count > 0 ? out : in, count, this->max_count_);
    if (count == 0) return;
    this->begin_call(count, stream);
    const schedule::range rail = this->rail_shard(count);
    this->intra_.reduce_scatter(in, this->shard_.data(), count, stream);
    detail::issue_call<Backend>(this->inter_, this->shard_.data(), out, rail.count, stream);
  }
};

}  // namespace lowbit
