// The full-precision node-local stage of the hierarchical collectives on the host (MPI)
// backend: frames of raw values moved by the backend's own all-to-all and all-gather (so
// with their headers and deadlines), summed in fp32 in rank order, which is what makes
// the result reproducible and equal to a host simulation (MPI_Reduce_scatter's order of
// summation is the library's).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "lowbit/collective/detail/backend_mpi.hpp"
#include "lowbit/collective/detail/hierarchical_stage.hpp"

namespace lowbit::detail {

template <class T>
class full_precision_stage<backend::mpi, T> {
  using impl = backend_impl<backend::mpi>;
  static constexpr std::size_t H = impl::header_bytes;

 public:
  /// Sizes every buffer for counts up to max_count (collective over `intra`: the
  /// backend duplicates it).
  full_precision_stage(const comm::mpi_comm& intra, std::size_t max_count, std::size_t block,
                       const collective_options& opts, const char* who)
      : be_(intra, 0, 1),
        who_(who),
        G_(intra.size()),
        me_(intra.rank()),
        calls_(who, opts.timeout, G_, me_) {
    const std::size_t shard = schedule::shard(max_count, block, G_, 0).count;  // the largest
    const size_math m(who, max_count);
    const std::size_t slot = m.add(H, m.mul(shard, sizeof(T)));
    impl::check_sizes(m.mul(slot, G_), m.mul(slot, G_), m.mul(slot, G_));
    send_ = host_buffer<std::byte>(m.mul(slot, G_));
    recv_ = host_buffer<std::byte>(m.mul(slot, G_));
    acc_ = host_buffer<float>(shard);
    const std::size_t g = static_cast<std::size_t>(G_);
    send_bytes_.assign(g, 0);
    send_off_.assign(g, 0);
    recv_bytes_.assign(g, 0);
    recv_off_.assign(g, 0);
  }

  /// out = the fp32 sum, in rank order, of every rank's piece of `in` that `ranges` names
  /// for this rank (times 1/G for avg), rounded once to T. ranges(p, f) calls f(r) for
  /// each range r of rank p's rail shard (indices from the shard's start) of this call;
  /// `out` is indexed from this rank's shard's start. One frame per peer, whatever the
  /// ranges: the per-element sums are those of the whole shard, chunk by chunk.
  template <class Ranges>
  void reduce_scatter(const T* in, T* out, std::size_t count, std::size_t block, reduce_op op,
                      const Ranges& ranges, impl::stream_type) {
    call_check cc = begin(count, "stage 1 (node-local reduce-scatter)");
    const schedule::range mine = schedule::shard(count, block, G_, me_);
    const std::size_t n_me = values_of(ranges, me_);
    std::size_t send = 0;
    for (int p = 0; p < G_; ++p) {
      const std::size_t i = static_cast<std::size_t>(p);
      const schedule::range s = schedule::shard(count, block, G_, p);
      send_off_[i] = send;
      send_bytes_[i] = p == me_ ? 0 : H + values_of(ranges, p) * sizeof(T);
      recv_off_[i] = i * (H + n_me * sizeof(T));
      recv_bytes_[i] = p == me_ ? 0 : H + n_me * sizeof(T);
      if (p == me_) continue;
      put(send_.data() + send, in + s.begin, ranges, p, cc);
      send += send_bytes_[i];
    }
    be_.alltoallv(lane::comm, send_, send_bytes_.data(), send_off_.data(), recv_,
                  recv_bytes_.data(), recv_off_.data(), nullptr, cc);
    check(cc, recv_off_);
    float* acc = acc_.data();
    for (std::size_t j = 0; j < n_me; ++j) acc[j] = 0.0f;
    for (int p = 0; p < G_; ++p) {
      if (p == me_) {
        std::size_t j = 0;
        ranges(me_, [&](schedule::range r) {
          for (std::size_t e = 0; e < r.count; ++e, ++j)
            acc[j] = fadd(acc[j], to_float(in[mine.begin + r.begin + e]));
        });
      } else {
        const T* x = values(recv_.data() + recv_off_[p]);
        for (std::size_t j = 0; j < n_me; ++j) acc[j] = fadd(acc[j], to_float(x[j]));
      }
    }
    const float scale = op == reduce_op::avg ? 1.0f / static_cast<float>(G_) : 1.0f;
    std::size_t j = 0;
    ranges(me_, [&](schedule::range r) {
      for (std::size_t e = 0; e < r.count; ++e, ++j)
        out[r.begin + e] = from_float<T>(scale != 1.0f ? fmul(acc[j], scale) : acc[j]);
    });
  }
  /// The whole shard in one call.
  void reduce_scatter(const T* in, T* out, std::size_t count, std::size_t block, reduce_op op,
                      impl::stream_type stream) {
    reduce_scatter(in, out, count, block, op, schedule::whole_shards{count, block, G_}, stream);
  }

  /// out gets every rank's pieces that `ranges` names (ranges as reduce_scatter's), `in`
  /// holding this rank's shard (indexed from its start); out is the whole tensor.
  template <class Ranges>
  void all_gather(const T* in, T* out, std::size_t count, std::size_t block, const Ranges& ranges,
                  impl::stream_type) {
    call_check cc = begin(count, "stage 3 (node-local all-gather)");
    std::size_t widest = 0;
    for (int p = 0; p < G_; ++p) widest = std::max(widest, values_of(ranges, p));
    const std::size_t slot = H + widest * sizeof(T);
    put(recv_.data() + static_cast<std::size_t>(me_) * slot, in, ranges, me_, cc);
    be_.allgather(lane::comm, recv_, 0, slot, 32, cc);
    for (int p = 0; p < G_; ++p) gather_off_[p] = static_cast<std::size_t>(p) * slot;
    check(cc, gather_off_);
    for (int p = 0; p < G_; ++p) {
      const schedule::range s = schedule::shard(count, block, G_, p);
      const T* x = values(recv_.data() + gather_off_[p]);
      ranges(p, [&](schedule::range r) {
        const T* from = p == me_ ? in + r.begin : x;
        if (out + s.begin + r.begin != from)
          std::memmove(out + s.begin + r.begin, from, r.count * sizeof(T));
        x += r.count;
      });
    }
  }
  /// The whole tensor in one call.
  void all_gather(const T* in, T* out, std::size_t count, std::size_t block, impl::stream_type s) {
    all_gather(in, out, count, block, schedule::whole_shards{count, block, G_}, s);
  }

 private:
  /// The call's expected header (seq: this stage's calls so far).
  call_check begin(std::size_t count, const char* what) {
    gather_off_.assign(static_cast<std::size_t>(G_), 0);
    return calls_.begin<T, full_precision_stage>(count, what);
  }
  /// A frame: the header, then the values of rank p's ranges of `shard`, back to back.
  template <class Ranges>
  static void put(std::byte* slot, const T* shard, const Ranges& ranges, int p,
                  const call_check& cc) {
    std::memcpy(slot, &cc.want, H);
    std::byte* at = slot + H;
    ranges(p, [&](schedule::range r) {
      std::memcpy(at, shard + r.begin, r.count * sizeof(T));
      at += r.count * sizeof(T);
    });
  }
  static const T* values(const std::byte* slot) { return reinterpret_cast<const T*>(slot + H); }
  /// Every peer's header; the agreement check before the call makes a mismatch here a
  /// lowbit bug or a peer that failed mid-call, so it raises at once.
  void check(call_check& cc, const std::vector<std::size_t>& off) {
    for (int p = 0; p < G_; ++p)
      if (p != me_ && !cc.bad[static_cast<std::size_t>(p)])
        cc.check_frame(recv_.data() + off[static_cast<std::size_t>(p)], p);
    if (cc.failed())
      throw agreement_error(__FILE__, __LINE__,
                            std::string(who_) + ": the ranks disagree: " + cc.error);
  }

  impl be_;
  const char* who_;
  int G_, me_;
  stage_calls calls_;
  host_buffer<std::byte> send_, recv_;
  host_buffer<float> acc_;
  std::vector<std::size_t> send_bytes_, send_off_, recv_bytes_, recv_off_, gather_off_;
};

/// The host backend's calls complete before they return (every wait with its deadline):
/// a hierarchical call has nothing left to wait for.
template <>
struct stage_sync<backend_impl<backend::mpi>::stream_type> {
  template <class IntraB, class InterB, class IntraComm, class InterComm, class Stream>
  static void wait(const IntraComm&, const InterComm&, Stream, const call_check&) {}
};

/// The host backend runs a hierarchical call's chunks one after the other, each step
/// complete before the next: nothing to link.
template <>
class stage_links<backend_impl<backend::mpi>::stream_type> {
 public:
  using stream_type = backend_impl<backend::mpi>::stream_type;
  explicit stage_links(int) {}
  stream_type begin(stream_type s, bool) { return s; }
  void staged(int) {}
  void input_ready(int) const {}
  void output_ready(int) const {}
  void before_gather(int) {}
  void end() {}
};

}  // namespace lowbit::detail
