// The schedule logic of the three collectives, written once against a backend
// (backend_impl<Backend>, collective/backend.hpp: the MPI host backend, the NCCL device
// backend, the node backend).
//
// all_reduce, per chunk k (piece k of every rank's shard; one chunk for schedule::flat):
//   1 compute  encode piece k of every shard (stage 0): own piece into its receive slot
//   2 comm     all-to-all of the frames
//   3 compute  decode + sum my piece's P frames in fp32, re-encode the sum (stage 1)
//              straight into my slot of the gather buffer, and write that frame's
//              decoded values into my piece of the output from the same pass
//   4 comm     in-place all-gather of the reduced frames
//   5 compute  decode every other rank's reduced frame into the output
// Every rank's output is the decode of the same gathered frames, so all ranks agree bit
// for bit. Phase 1 encodes the pieces other ranks wait for first and signals them before
// encoding its own, so that the transfer starts while the own piece is encoded.
// The one-shot all_reduce (two ranks by default; collective_options::algorithm), per
// chunk k (piece k of the whole tensor):
//   1 compute  encode my piece k into my slot of the gather buffer (stage 0)
//   2 comm     in-place all-gather of the frames
//   3 compute  decode + sum the P frames in fp32, in rank order, into the output
// Each phase is issued for all chunks before the next, on two lanes (streams on NCCL)
// linked by one event per chunk and phase, so chunk k+1's encoding overlaps chunk k's
// transfer. Every read of the input happens in phase 1, before any write of the output
// (phase 3 or 5) on the same lane: in-place and overlapping calls are safe.
//
// A caller that produces the input and consumes the output chunk by chunk (the
// hierarchical collectives) passes `Links`: links.input_ready(k) is issued on the compute
// lane before chunk k's input is first read, links.output_ready(k) after chunk k's output
// is complete; every path of a call (empty, one rank, fallback, one chunk) issues both
// for each of its chunks(count) chunks, so the caller's events are always recorded.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lowbit/codec/codec.hpp"
#include "lowbit/codec/philox.hpp"
#include "lowbit/collective/backend.hpp"
#include "lowbit/collective/detail/agreement.hpp"
#include "lowbit/collective/detail/call_state.hpp"
#include "lowbit/collective/detail/frame_plan.hpp"
#include "lowbit/collective/detail/workspace.hpp"
#include "lowbit/collective/types.hpp"
#include "lowbit/core/config.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/numeric.hpp"
#include "lowbit/feedback/state.hpp"
#include "lowbit/schedule/schedule.hpp"

namespace lowbit::detail {

/// Event slots an engine uses: one per chunk and phase. `contributed`: the frame this rank
/// adds to the chunk's all-gather is written (a re-encoded sum, or a bare encode in
/// one_shot and all_gather).
enum class phase { encoded = 0, exchanged = 1, contributed = 2, gathered = 3 };
constexpr int num_phases = 4;

template <class... Codecs>
struct codec_list {};

/// Links of a call that nothing produces or consumes chunk by chunk: the flat collectives'.
struct no_links {
  void input_ready(int) const {}
  void output_ready(int) const {}
};

/// Plans, workspace and feedback state of one collective object, and the three
/// schedules. `Codecs` lists every codec a call may use (one for a fixed width, the
/// whole set for a run-time width); the workspace fits the largest.
template <class Backend, class T, class Feedback, class Schedule, class... Codecs>
class engine {
  using impl = backend_impl<Backend>;
  template <class U>
  using buffer = typename impl::template buffer<U>;
  /// Bytes of frame_header before every frame the backend sends.
  static constexpr std::size_t H = impl::header_bytes;
  static_assert(H == sizeof(frame_header), "lowbit backend: every frame carries a frame_header");
  /// Where the host reads the headers (MPI), the own piece of two_phase is decoded in phase
  /// 5, once every gathered header is known to agree. Where the kernels check them (NCCL),
  /// phase 3's fused pass decodes it after checking every received header: a rank whose call
  /// differs says so in every frame it sends, so phase 3 sees what phase 5 would.
  static constexpr bool own_piece_late = impl::host_frames;

 public:
  using comm_type = typename impl::comm_type;
  using stream_type = typename impl::stream_type;

  engine(const comm_type& comm, std::size_t max_count, const collective_options& opts,
         collective_kind kind, const char* who)
      : be_(checked(comm, who), Schedule::max_chunks * num_phases, Schedule::streams),
        who_(who),
        max_count_(max_count),
        opts_(opts),
        calls_(opts.first_step),
        P_(comm.size()),
        rank_(comm.rank()),
        one_shot_(kind == collective_kind::all_reduce &&
                  (opts.algorithm == all_reduce_algorithm::one_shot ||
                   (opts.algorithm == all_reduce_algorithm::automatic && P_ == 2))) {
    const size_math m(who, max_count);
    m.mul(m.add(max_count, 0), 2 * sizeof(float));  // the largest state: two fp32 arrays
    std::size_t send = 0, recv = 0, gather = 0, shard = 0;
    const capacity caps[] = {
        capacity_of<Codecs>(max_count, P_, Schedule::max_chunks, one_shot_, H, m)...};
    for (const auto& c : caps) {
      send = std::max(send, c.send);
      recv = std::max(recv, c.recv);
      gather = std::max(gather, c.gather);
      shard = std::max(shard, c.shard);
    }
    if (P_ == 1) send = recv = gather = shard = 0;  // one rank copies: no frames
    impl::check_sizes(send, recv, gather);
    be_.set_transport(opts.transport, opts.transport_policy, std::max({Codecs::bits...}));
    send_ = be_.make_transfer_buffer(send);
    recv_ = be_.make_transfer_buffer(recv);
    gather_ = be_.make_transfer_buffer(gather);
    if constexpr (impl::needs_sum_scratch) acc_ = buffer<float>(shard);
    if constexpr (Feedback::replicated) tmp_ = buffer<float>(max_count);
    // Only two_phase's all_reduce re-encodes, so only it keeps a second-stage residual.
    const bool reencodes = kind == collective_kind::all_reduce && !one_shot_;
    state_ = feedback::state<Feedback, buffer>(max_count, reencodes ? shard : 0);
    plan_ = frame_plan<Schedule>(Schedule::max_chunks, P_, rank_, H);
    // Sized once: backends index it by rank even in calls that check no frame.
    cc_ = call_check("", frame_header{}, opts.timeout, P_);
  }

  std::size_t max_count() const noexcept { return max_count_; }
  /// The collective's name, for messages ("lowbit::all_reduce").
  const char* name() const noexcept { return who_; }
  /// Bytes of workspace and feedback state this object holds (host or device memory).
  std::size_t workspace_bytes() const noexcept {
    return send_.size() + recv_.size() + gather_.size() +
           sizeof(float) * (acc_.size() + tmp_.size()) + state_.bytes();
  }
  int size() const noexcept { return P_; }
  /// The all_reduce algorithm this object runs (automatic resolved).
  all_reduce_algorithm algorithm() const noexcept {
    return one_shot_ ? all_reduce_algorithm::one_shot : all_reduce_algorithm::two_phase;
  }
  int rank() const noexcept { return rank_; }
  /// How the backend moves frames (automatic resolved; automatic on the MPI backend).
  frame_transport transport() const noexcept { return be_.transport(); }
  std::uint32_t step() const noexcept { return calls_.step(); }
  void set_step(std::uint32_t s) noexcept { calls_.set_step(s); }
  const collective_options& options() const noexcept { return opts_; }
  /// Calls on fewer input bytes run NCCL's own collective (see
  /// collective_options::crossover_bytes).
  std::size_t crossover_bytes() const noexcept { return opts_.crossover_bytes; }
  void set_crossover_bytes(std::size_t bytes) noexcept { opts_.crossover_bytes = bytes; }

  /// True when a call of `count` values takes the fallback path: EF21's replicated state is
  /// defined by the codec's output, so it never does.
  bool below_crossover(std::size_t count) const noexcept {
    return !Feedback::replicated && count * sizeof(T) < opts_.crossover_bytes;
  }
  feedback::state<Feedback, buffer>& feedback_state() noexcept { return state_; }
  impl& backend() noexcept { return be_; }

  /// This rank's shard of a `count`-element tensor under `Codec`.
  template <class Codec>
  schedule::range my_shard(std::size_t count) const {
    return schedule::shard(count, Codec::block_size, P_, rank_);
  }

  /// The chunks a call of `count` values runs in (what plan() returns; 1 on the empty,
  /// one-rank and fallback paths). The same on every rank of the communicator, and on every
  /// communicator of the same size and options: a hierarchical collective computes its
  /// peers' chunks with it.
  template <class Codec>
  int chunks(std::size_t count) const {
    if (count == 0 || P_ == 1) return 1;
    if constexpr (impl::has_fallback)
      if (below_crossover(count)) return 1;
    return schedule::num_chunks<Schedule>(count, Codec::block_size, one_shot_ ? 1 : P_);
  }
  /// Calls f(range) for every non-empty range of the input that chunk k of K of a
  /// `count`-value call reads (and whose output it writes): piece k of the whole tensor
  /// (one shot, or one chunk), else piece k of every rank's shard, in rank order.
  template <class Codec, class F>
  void chunk_ranges(std::size_t count, int K, int k, F&& f) const {
    const std::size_t B = Codec::block_size;
    if (one_shot_ || K == 1 || P_ == 1) {
      const schedule::range r = schedule::piece<Schedule>({0, count}, B, K, k);
      if (r.count > 0) f(r);
      return;
    }
    for (int p = 0; p < P_; ++p) {
      const schedule::range r = shard_piece(count, B, p, K, k);
      if (r.count > 0) f(r);
    }
  }

  /// Waits until the calls issued on `stream` have finished, within options().timeout
  /// (NCCL; the MPI backend's calls finish before they return): lowbit::timeout_error,
  /// with the communicator aborted, on expiry.
  void sync(stream_type stream, const char* who) {
    calls_.guard([&] { be_.sync(stream, call_check(who, calls_.last(), opts_.timeout, P_)); });
    raise_recorded_disagreement(who);
  }

  // ---- all_reduce -------------------------------------------------------------------
  template <class Codec, class Links = no_links>
  void all_reduce(const T* in, T* out, std::size_t count, stream_type stream, const char* who,
                  const Links& links = {}) {
    validate(in, out, count, count, count, who);
    if (count == 0) return whole_call(links, [] {});
    call_check& cc = begin_call<Codec>(count, who, stream);
    if (P_ == 1) return whole_call(links, [&] { copy_call(in, out, count, stream); });
    if constexpr (impl::has_fallback) {
      if (below_crossover(count)) {
        return whole_call(links, [&] {
          be_.fallback_all_reduce(in, out, count, opts_.op, stream);
          calls_.advance_step();
        });
      }
    }
    if (one_shot_) {
      all_reduce_one_shot<Codec>(in, out, count, stream, cc, links);
      return;
    }
    const int K = plan<Codec>(count);
    const rng_key key0{opts_.seed, calls_.step(), static_cast<std::uint32_t>(rank_), 0};
    const rng_key key1{opts_.seed, calls_.step(), static_cast<std::uint32_t>(rank_), 1};
    const float scale = output_scale();
    const schedule::range mine = my_shard<Codec>(count);
    const std::size_t B = Codec::block_size;
    be_.begin(stream, K > 1);

    encode_pieces<Codec>(in, count, K, key0, links);
    exchange(K, cc);
    check_received(K, cc);
    for (int k = 0; k < K; ++k) {  // 3: reduce my piece, re-encode it into my gather slot
      be_.wait(lane::compute, event(k, phase::exchanged));
      const schedule::range pc = schedule::piece<Schedule>(mine, B, K, k);
      std::byte* slot = gather_.data() + plan_.gather_off[k] + rank_ * plan_.gather_slot[k];
      if (pc.count > 0 && !cc.failed()) {
        // EF21 decodes into its replicated state in phase 5 instead.
        T* decoded = Feedback::replicated || own_piece_late ? nullptr : out + pc.begin;
        be_.template reduce_encode<Codec>(
            lane::compute, recv_.data() + plan_.recv_base[k] + H, plan_.recv_stride[k], P_,
            pc.count, slot + H, key1, pc.begin, state_.stage2_ref().shifted(pc.begin - mine.begin),
            acc_.data(), decoded, scale, received(k), header());
      } else {  // no values (or a disagreement seen on the host): the header alone
        stamp(slot, cc.failed(), received(k));
      }
      be_.signal(lane::compute, event(k, phase::contributed));
    }
    gather(K, phase::contributed, Codec::bits, cc);
    check_gathered(K, cc);
    for (int k = 0; k < K; ++k) {  // 5: decode the reduced frames (mine is done, but EF21's)
      be_.wait(lane::compute, event(k, phase::gathered));
      for (int p = 0; p < P_ && !cc.failed(); ++p) {
        if (p == rank_ && !Feedback::replicated && !own_piece_late) continue;
        const schedule::range pc = shard_piece(count, B, p, K, k);
        if (pc.count == 0) continue;
        const std::byte* frame =
            gather_.data() + plan_.gather_off[k] + p * plan_.gather_slot[k] + H;
        if constexpr (Feedback::replicated) {  // EF21: g += reduced; output g
          be_.template decode<Codec>(lane::compute, frame, pc.count, tmp_.data() + pc.begin, scale,
                                     gathered(k));
          be_.accumulate_output(lane::compute, tmp_.data() + pc.begin, pc.count,
                                state_.replicated() + pc.begin, out + pc.begin, gathered(k));
        } else {
          be_.template decode<Codec>(lane::compute, frame, pc.count, out + pc.begin, scale,
                                     gathered(k));
        }
      }
      links.output_ready(k);
    }
    be_.end();
    calls_.advance_step();
    end_call(cc);
  }

  // ---- all_reduce, one shot: gather every rank's frame, every rank sums them all ------
  template <class Codec, class Links>
  void all_reduce_one_shot(const T* in, T* out, std::size_t count, stream_type stream,
                           call_check& cc, const Links& links) {
    const std::size_t B = Codec::block_size;
    const int K = plan_one_shot<Codec>(count);
    const rng_key key0{opts_.seed, calls_.step(), static_cast<std::uint32_t>(rank_), 0};
    const float scale = output_scale();
    const schedule::range all{0, count};
    const auto fb = state_.worker_ref();
    be_.begin(stream, K > 1);
    for (int k = 0; k < K; ++k) {  // 1: encode my piece k into my slot
      const schedule::range pc = schedule::piece<Schedule>(all, B, K, k);
      std::byte* slot = gather_.data() + plan_.gather_off[k] + rank_ * plan_.gather_slot[k];
      links.input_ready(k);
      be_.template encode<Codec>(lane::compute, in + pc.begin, pc.count, slot + H, key0, pc.begin,
                                 fb.shifted(pc.begin), header());
      be_.signal(lane::compute, event(k, phase::contributed));
    }
    gather(K, phase::contributed, Codec::bits, cc);
    check_gathered(K, cc);
    for (int k = 0; k < K && !cc.failed(); ++k) {  // 3: sum the P frames of piece k
      be_.wait(lane::compute, event(k, phase::gathered));
      const schedule::range pc = schedule::piece<Schedule>(all, B, K, k);
      const std::byte* frames = gather_.data() + plan_.gather_off[k] + H;
      if constexpr (Feedback::replicated) {  // EF21: g += reduced; output g
        be_.template reduce<Codec>(lane::compute, frames, plan_.gather_slot[k], P_, pc.count,
                                   tmp_.data() + pc.begin, scale, acc_.data(), gathered(k));
        be_.accumulate_output(lane::compute, tmp_.data() + pc.begin, pc.count,
                              state_.replicated() + pc.begin, out + pc.begin, gathered(k));
      } else {
        be_.template reduce<Codec>(lane::compute, frames, plan_.gather_slot[k], P_, pc.count,
                                   out + pc.begin, scale, acc_.data(), gathered(k));
      }
      links.output_ready(k);
    }
    be_.end();
    calls_.advance_step();
    end_call(cc);
  }

  // ---- reduce_scatter: out gets my shard, the exact fp32 sum of the decoded frames ------
  template <class Codec, class Links = no_links>
  void reduce_scatter(const T* in, T* out, std::size_t count, stream_type stream, const char* who,
                      const Links& links = {}) {
    const schedule::range mine = my_shard<Codec>(count);
    validate(in, out, count, count, mine.count, who);
    if (count == 0) return whole_call(links, [] {});
    call_check& cc = begin_call<Codec>(count, who, stream);
    if (P_ == 1) return whole_call(links, [&] { copy_call(in, out, count, stream); });
    if constexpr (impl::has_fallback) {
      if (below_crossover(count)) {
        return whole_call(links, [&] {
          be_.fallback_reduce_scatter(in, out, count, Codec::block_size, opts_.op, stream);
          calls_.advance_step();
        });
      }
    }
    const int K = plan<Codec>(count);
    const rng_key key0{opts_.seed, calls_.step(), static_cast<std::uint32_t>(rank_), 0};
    const float scale = output_scale();
    const std::size_t B = Codec::block_size;
    be_.begin(stream, K > 1);
    encode_pieces<Codec>(in, count, K, key0, links);
    exchange(K, cc);
    check_received(K, cc);
    for (int k = 0; k < K; ++k) {
      be_.wait(lane::compute, event(k, phase::exchanged));
      const schedule::range pc = schedule::piece<Schedule>(mine, B, K, k);
      if (pc.count > 0 && !cc.failed()) {
        const std::byte* frames = recv_.data() + plan_.recv_base[k] + H;
        T* dst = out + (pc.begin - mine.begin);
        if constexpr (Feedback::replicated) {  // EF21 over my shard: g += reduced; output g
          be_.template reduce<Codec>(lane::compute, frames, plan_.recv_stride[k], P_, pc.count,
                                     tmp_.data() + pc.begin, scale, acc_.data(), received(k));
          be_.accumulate_output(lane::compute, tmp_.data() + pc.begin, pc.count,
                                state_.replicated() + pc.begin, dst, received(k));
        } else {
          be_.template reduce<Codec>(lane::compute, frames, plan_.recv_stride[k], P_, pc.count, dst,
                                     scale, acc_.data(), received(k));
        }
      }
      links.output_ready(k);
    }
    be_.end();
    calls_.advance_step();
    end_call(cc);
  }

  // ---- all_gather: in is my shard of a count-element tensor; out gets the whole --------
  template <class Codec>
  void all_gather(const T* in, T* out, std::size_t count, stream_type stream, const char* who) {
    const schedule::range mine = my_shard<Codec>(count);
    validate(in, out, count, mine.count, count, who);
    if (count == 0) return;
    call_check& cc = begin_call<Codec>(count, who, stream);
    if (P_ == 1) return copy_call(in, out, count, stream);
    if constexpr (impl::has_fallback) {
      if (below_crossover(count)) {
        be_.fallback_all_gather(in, out, count, Codec::block_size, stream);
        calls_.advance_step();
        return;
      }
    }
    const int K = plan<Codec>(count);
    const rng_key key0{opts_.seed, calls_.step(), static_cast<std::uint32_t>(rank_), 0};
    const std::size_t B = Codec::block_size;
    be_.begin(stream, K > 1);
    for (int k = 0; k < K; ++k) {
      const schedule::range pc = schedule::piece<Schedule>(mine, B, K, k);
      std::byte* slot = gather_.data() + plan_.gather_off[k] + rank_ * plan_.gather_slot[k];
      if (pc.count > 0) {
        be_.template encode<Codec>(lane::compute, in + (pc.begin - mine.begin), pc.count, slot + H,
                                   key0, pc.begin, state_.worker_ref().shifted(pc.begin), header());
      } else {
        stamp(slot, false, {});
      }
      be_.signal(lane::compute, event(k, phase::contributed));
    }
    gather(K, phase::contributed, Codec::bits, cc);
    check_gathered(K, cc);
    for (int k = 0; k < K; ++k) {
      be_.wait(lane::compute, event(k, phase::gathered));
      for (int p = 0; p < P_ && !cc.failed(); ++p) {
        const schedule::range pc = shard_piece(count, B, p, K, k);
        if (pc.count == 0) continue;
        be_.template decode<Codec>(
            lane::compute, gather_.data() + plan_.gather_off[k] + p * plan_.gather_slot[k] + H,
            pc.count, out + pc.begin, 1.0f, gathered(k));
      }
    }
    be_.end();
    calls_.advance_step();
    end_call(cc);
  }

 private:
  static const comm_type& checked(const comm_type& comm, const char* who) {
    impl::check_comm(comm, who);
    return comm;
  }

  static int event(int k, phase ph) { return k * num_phases + static_cast<int>(ph); }

  /// What the decoded sum is multiplied by: 1/P for avg.
  float output_scale() const {
    return opts_.op == reduce_op::avg ? 1.0f / static_cast<float>(P_) : 1.0f;
  }

  /// Preconditions of every call; throws before any byte moves. `in_count` and
  /// `out_count` are the elements read from `in` and written to `out`.
  void validate(const void* in, const void* out, std::size_t count, std::size_t in_count,
                std::size_t out_count, const char* who) {
    if (count > max_count_)
      throw invalid_argument(__FILE__, __LINE__,
                             std::string(who) + ": count " + std::to_string(count) +
                                 " exceeds the max_count " + std::to_string(max_count_) +
                                 " this object was built for");
    if (in_count > 0 && in == nullptr)
      throw invalid_argument(__FILE__, __LINE__, std::string(who) + ": the input pointer is null");
    if (out_count > 0 && out == nullptr)
      throw invalid_argument(__FILE__, __LINE__, std::string(who) + ": the output pointer is null");
    raise_recorded_disagreement(who);
    calls_.require_usable(who);
    be_.check_alive(who);
  }

 public:
  /// A disagreement that the backend's kernels recorded in an earlier call (whose output
  /// they left untouched): raised once, then this object is retired. (Public for the
  /// hierarchical collectives, whose stages' calls are this engine's.)
  void raise_recorded_disagreement(const char* who) {
    if (calls_.retired()) return;
    std::string d = be_.disagreement();
    if (d.empty()) return;
    calls_.retire(d);
    throw agreement_error(__FILE__, __LINE__,
                          std::string(who) + ": the ranks disagreed " + d +
                              "; nothing was written to that call's output, and this "
                              "collective object is now unusable");
  }

 private:
  /// Starts a call of `count` values: its header (what every frame and fingerprint says
  /// of it) and, in checked mode, the fingerprint exchange. Every rank's call number
  /// advances here, whichever path the call then takes.
  template <class Codec>
  call_check& begin_call(std::size_t count, const char* who, stream_type stream) {
    const std::uint32_t seq = calls_.begin(count);
    cc_.error.clear();
    std::fill(cc_.bad.begin(), cc_.bad.end(), 0);
    frame_header h;
    h.magic = frame_magic;
    h.config = config_id<T, Codec, Feedback, Schedule>(
        fnv1a(who) ^ (static_cast<std::uint32_t>(opts_.op) << 1) ^ (one_shot_ ? 1u : 0u));
    h.count = count;
    h.step = calls_.step();
    h.seq = seq;
    h.bits = static_cast<std::uint16_t>(Codec::bits);
    h.rank = static_cast<std::uint32_t>(rank_);
    cc_.who = who;
    cc_.want = h;
    if (opts_.verify) {
      be_.set_check_stream(stream);
      verify(cc_);
    }
    return cc_;
  }

  /// Checked mode: every rank's fingerprint, compared by every rank, before a frame moves.
  void verify(call_check& cc) {
    const std::byte* all = be_.allgather_small(&cc.want, sizeof(frame_header), cc);
    for (int p = 0; p < P_; ++p) {
      if (p == rank_) continue;
      const std::string why = mismatch(load_header(all + p * sizeof(frame_header)), cc.want, p);
      if (!why.empty())
        throw agreement_error(__FILE__, __LINE__,
                              std::string(cc.who) + " (checked mode): " + why +
                                  "; no frame was sent and nothing written");
    }
  }

  /// A call of one chunk whose work `run` issues: the links around it.
  template <class Links, class Run>
  void whole_call(const Links& links, Run&& run) {
    links.input_ready(0);
    run();
    links.output_ready(0);
  }

  /// A one-rank call: nothing crosses a wire, so the result is the input, exactly (no
  /// codec, no feedback update); in place it is nothing at all.
  void copy_call(const T* in, T* out, std::size_t count, stream_type stream) {
    be_.copy(in, out, count, stream);
    calls_.advance_step();
  }

  /// Ends a call: raises the first disagreement its frames showed (nothing was written to
  /// the output), and retires this object, whose private channel may hold stray frames.
  void end_call(const call_check& cc) {
    if (!cc.failed()) return;
    calls_.retire(cc.error);
    throw agreement_error(__FILE__, __LINE__,
                          std::string(cc.who) + ": the ranks disagree: " + cc.error +
                              "; nothing was written to the output");
  }

  /// This call's header, as its frames carry it.
  const frame_header& header() const { return cc_.want; }

  /// Writes this call's header at `slot` with no frame after it: poisoned when this rank
  /// knows the ranks disagree, or (a backend whose kernels check headers) when one of
  /// `check`'s does.
  void stamp(std::byte* slot, bool poison, const header_set& check) {
    frame_header h = cc_.want;
    if (poison) h.flags |= poisoned;
    be_.stamp(lane::compute, slot, h, check);
  }

  /// The headers of chunk k's frames received for my piece (phase 2's), and of its
  /// gathered frames (phase 4's): what the steps that consume them check.
  header_set received(int k) const {
    return {recv_.data() + plan_.recv_base[k], plan_.recv_stride[k], P_, cc_.want};
  }
  header_set gathered(int k) const {
    return {gather_.data() + plan_.gather_off[k], plan_.gather_slot[k], P_, cc_.want};
  }

  /// After phase 2: the headers of the frames received for my pieces (host frames only).
  void check_received(int K, call_check& cc) {
    if constexpr (impl::host_frames) {
      for (int k = 0; k < K; ++k)
        for (int p = 0; p < P_; ++p) {
          const std::size_t i = static_cast<std::size_t>(k) * P_ + p;
          if (p != rank_ && plan_.recv_bytes[i] > 0 && !cc.bad[static_cast<std::size_t>(p)])
            cc.check_frame(recv_.data() + plan_.recv_off[i], p);
        }
    }
  }

  /// After phase 4: the headers of every other rank's gathered frame (host frames only).
  void check_gathered(int K, call_check& cc) {
    if constexpr (impl::host_frames) {
      for (int k = 0; k < K; ++k)
        for (int p = 0; p < P_; ++p)
          if (p != rank_ && plan_.gather_slot[k] > 0 && !cc.bad[static_cast<std::size_t>(p)])
            cc.check_frame(gather_.data() + plan_.gather_off[k] + p * plan_.gather_slot[k], p);
    }
  }

  /// Piece k of K of rank p's shard of a `count`-element tensor in blocks of B.
  schedule::range shard_piece(std::size_t count, std::size_t B, int p, int K, int k) const {
    return plan_.shard_piece(count, B, p, K, k);
  }

  /// The layouts of a call (frame_plan), checked against this object's buffers.
  template <class Codec>
  int plan(std::size_t count) {
    return plan_.template two_phase<Codec>(count, send_.size(), recv_.size(), gather_.size());
  }
  template <class Codec>
  int plan_one_shot(std::size_t count) {
    return plan_.template one_shot<Codec>(count, gather_.size());
  }

  /// Phase 1: every shard's piece k, encoded for its owner (stage 0).
  template <class Codec, class Links>
  void encode_pieces(const T* in, std::size_t count, int K, const rng_key& key0,
                     const Links& links) {
    const std::size_t B = Codec::block_size;
    const auto fb = state_.worker_ref();
    const auto encode_piece = [&](int k, int p) {
      const schedule::range pc = shard_piece(count, B, p, K, k);
      const std::size_t i = static_cast<std::size_t>(k) * P_ + p;
      std::byte* slot =
          p == rank_ ? recv_.data() + plan_.recv_off[i] : send_.data() + plan_.send_off[i];
      if (pc.count == 0) return stamp(slot, false, {});  // an empty piece sends its header alone
      be_.template encode<Codec>(lane::compute, in + pc.begin, pc.count, slot + H, key0, pc.begin,
                                 fb.shifted(pc.begin), header());
    };
    for (int k = 0; k < K; ++k) {
      links.input_ready(k);
      for (int p = 0; p < P_; ++p)
        if (p != rank_) encode_piece(k, p);
      be_.signal(lane::compute, event(k, phase::encoded));
      encode_piece(k, rank_);  // needed only by phase 3, on this lane
    }
  }

  /// Phase 2: all-to-all of every chunk's frames.
  void exchange(int K, call_check& cc) {
    for (int k = 0; k < K; ++k) {
      be_.wait(lane::comm, event(k, phase::encoded));
      const std::size_t i = static_cast<std::size_t>(k) * P_;
      be_.alltoallv(lane::comm, send_, plan_.send_bytes.data() + i, plan_.send_off.data() + i,
                    recv_, plan_.recv_bytes.data() + i, plan_.recv_off.data() + i,
                    plan_.peer_recv_off.data() + i, cc);
      be_.signal(lane::comm, event(k, phase::exchanged));
    }
  }

  /// Phase 4: in-place all-gather of every chunk's slots, once `ready` is signalled.
  void gather(int K, phase ready, int bits, call_check& cc) {
    for (int k = 0; k < K; ++k) {
      be_.wait(lane::comm, event(k, ready));
      if (plan_.gather_slot[k] > 0)
        be_.allgather(lane::comm, gather_, plan_.gather_off[k], plan_.gather_slot[k], bits, cc);
      be_.signal(lane::comm, event(k, phase::gathered));
    }
  }

  impl be_;
  const char* who_;
  std::size_t max_count_;
  collective_options opts_;
  call_state calls_;  ///< call numbers, steps, retirement
  int P_, rank_;
  bool one_shot_;
  call_check cc_;                                        ///< the current call's agreement state
  typename impl::transfer_buffer send_, recv_, gather_;  ///< what the backend moves
  buffer<float> acc_, tmp_;
  feedback::state<Feedback, buffer> state_;
  frame_plan<Schedule> plan_;  ///< the current call's frame layout
};

}  // namespace lowbit::detail
