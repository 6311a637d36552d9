// The full-precision node-local stage of the hierarchical collectives on the node backend:
// frames of raw values (a header, then T) stored into the peers' windows by the backend's
// own transfers (so with their headers and deadlines), summed in fp32 in rank order on the
// GPU. The same sum as the host backend's stage (hierarchical_mpi.hpp), to the bit: a
// hierarchical collective on the node backend computes what the MPI backend's does.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "lowbit/collective/detail/backend_node.cuh"
#include "lowbit/collective/detail/hierarchical_device.cuh"
#include "lowbit/collective/detail/hierarchical_stage.hpp"
#include "lowbit/collective/detail/workspace.hpp"
#include "lowbit/kernels/raw_frames.cuh"

namespace lowbit::detail {

template <class T>
class full_precision_stage<backend::node, T> {
  using impl = backend_impl<backend::node>;
  static constexpr std::size_t H = impl::header_bytes;

 public:
  /// Two windows of one frame per rank, each of the largest shard (collective over `intra`:
  /// every rank maps every other's).
  full_precision_stage(const comm::node_comm& intra, std::size_t max_count, std::size_t block,
                       const collective_options& opts, const char* who)
      : be_(intra, 0, 1), G_(intra.size()), me_(intra.rank()), calls_(who, opts.timeout, G_, me_) {
    const std::size_t shard = schedule::shard(max_count, block, G_, 0).count;  // the largest
    const size_math m(who, max_count);
    const std::size_t slot = m.add(m.add(H, m.mul(shard, sizeof(T))), 15) & ~std::size_t(15);
    send_ = be_.make_transfer_buffer(m.mul(slot, G_));
    recv_ = be_.make_transfer_buffer(m.mul(slot, G_));
    scratch_ = device_buffer<T>(shard);
    const std::size_t g = static_cast<std::size_t>(G_);
    send_bytes_.assign(g, 0);
    send_off_.assign(g, 0);
    recv_bytes_.assign(g, 0);
    recv_off_.assign(g, 0);
    peer_off_.assign(g, 0);
  }

  /// out = the fp32 sum, in rank order, of every rank's piece of `in` that `ranges` names
  /// for this rank (times 1/G for avg), rounded once to T; ranges as the host backend's
  /// stage takes them (indices from the shard's start). Nothing is written when a frame's
  /// header disagrees (a peer that never sent it: the transfer cleared it at its deadline).
  template <class Ranges>
  void reduce_scatter(const T* in, T* out, std::size_t count, std::size_t block, reduce_op op,
                      const Ranges& ranges, cudaStream_t stream) {
    call_check cc = begin(count, "stage 1 (node-local reduce-scatter)", stream);
    const std::size_t n_me = values_of(ranges, me_);
    const std::size_t slot_me = slot_bytes(n_me);
    kernels::raw_copy<T> pack;
    pack.header = cc.want;
    std::size_t send = 0;
    for (int p = 0; p < G_; ++p) {
      const std::size_t i = static_cast<std::size_t>(p);
      const std::size_t n_p = values_of(ranges, p);
      std::byte* frame;  // this rank's frame for p: its own in its receive window
      if (p == me_) {
        frame = recv_.data() + i * slot_me;
      } else {
        frame = send_.data() + send;
        send_off_[i] = send;
        send_bytes_[i] = H + n_p * sizeof(T);
        peer_off_[i] = static_cast<std::size_t>(me_) * slot_bytes(n_p);
        recv_off_[i] = i * slot_me;
        recv_bytes_[i] = H + n_me * sizeof(T);
        send += slot_bytes(n_p);
      }
      stamp(pack, frame, stream);
      const schedule::range s = schedule::shard(count, block, G_, p);
      T* at = reinterpret_cast<T*>(frame + H);
      ranges(p, [&](schedule::range r) {
        piece(pack, in + s.begin + r.begin, at, r.count, {}, stream);
        at += r.count;
      });
    }
    send_bytes_[static_cast<std::size_t>(me_)] = recv_bytes_[static_cast<std::size_t>(me_)] = 0;
    flush(pack, {}, stream);
    be_.alltoallv(lane::compute, send_, send_bytes_.data(), send_off_.data(), recv_,
                  recv_bytes_.data(), recv_off_.data(), peer_off_.data(), cc);
    const kernels::header_check check = frames(slot_me, cc);
    const float scale = op == reduce_op::avg ? 1.0f / static_cast<float>(G_) : 1.0f;
    std::vector<schedule::range> mine;
    ranges(me_, [&](schedule::range r) { mine.push_back(r); });
    if (mine.size() == 1) {  // one piece: the sum goes straight to its place
      kernels::sum_raw_frames<T>(recv_.data(), slot_me, G_, n_me, out + mine[0].begin, scale, check,
                                 stream);
    } else {
      kernels::sum_raw_frames<T>(recv_.data(), slot_me, G_, n_me, scratch_.data(), scale, check,
                                 stream);
      kernels::raw_copy<T> unpack;
      const T* from = scratch_.data();
      for (const schedule::range& r : mine) {
        piece(unpack, from, out + r.begin, r.count, check, stream);
        from += r.count;
      }
      flush(unpack, check, stream);
    }
    be_.end();
  }
  /// The whole shard in one call.
  void reduce_scatter(const T* in, T* out, std::size_t count, std::size_t block, reduce_op op,
                      cudaStream_t stream) {
    reduce_scatter(in, out, count, block, op, schedule::whole_shards{count, block, G_}, stream);
  }

  /// out gets every rank's pieces that `ranges` names (ranges as reduce_scatter's), `in`
  /// holding this rank's shard (indexed from its start); out is the whole tensor. Nothing is
  /// written when a frame's header disagrees.
  template <class Ranges>
  void all_gather(const T* in, T* out, std::size_t count, std::size_t block, const Ranges& ranges,
                  cudaStream_t stream) {
    call_check cc = begin(count, "stage 3 (node-local all-gather)", stream);
    std::size_t widest = 0;
    for (int p = 0; p < G_; ++p) widest = std::max(widest, values_of(ranges, p));
    const std::size_t slot = slot_bytes(widest);
    std::byte* mine = recv_.data() + static_cast<std::size_t>(me_) * slot;
    kernels::raw_copy<T> pack;
    pack.header = cc.want;
    stamp(pack, mine, stream);
    T* at = reinterpret_cast<T*>(mine + H);
    ranges(me_, [&](schedule::range r) {
      piece(pack, in + r.begin, at, r.count, {}, stream);
      at += r.count;
    });
    flush(pack, {}, stream);
    be_.allgather(lane::compute, recv_, 0, slot, 32, cc);
    const kernels::header_check check = frames(slot, cc);
    kernels::raw_copy<T> unpack;
    for (int p = 0; p < G_; ++p) {
      const schedule::range s = schedule::shard(count, block, G_, p);
      const T* x =
          reinterpret_cast<const T*>(recv_.data() + static_cast<std::size_t>(p) * slot + H);
      ranges(p, [&](schedule::range r) {
        const T* from = p == me_ ? in + r.begin : x;
        if (out + s.begin + r.begin != from)
          piece(unpack, from, out + s.begin + r.begin, r.count, check, stream);
        x += r.count;
      });
    }
    flush(unpack, check, stream);
    be_.end();
  }
  /// The whole tensor in one call.
  void all_gather(const T* in, T* out, std::size_t count, std::size_t block, cudaStream_t s) {
    all_gather(in, out, count, block, schedule::whole_shards{count, block, G_}, s);
  }

  /// A disagreement this stage's kernels recorded (a frame that never landed, its header
  /// cleared at the transfer's deadline): lowbit::agreement_error, once.
  void raise_recorded_disagreement(const char* who) {
    if (reported_) return;
    const std::string d = be_.disagreement();
    if (d.empty()) return;
    reported_ = true;
    throw agreement_error(__FILE__, __LINE__,
                          std::string(who) + ": the ranks disagreed in the node-local stage " + d +
                              "; nothing was written to that call's output");
  }

 private:
  /// The call's expected header (seq: this stage's calls so far); starts the backend's
  /// lanes on the caller's stream.
  call_check begin(std::size_t count, const char* what, cudaStream_t stream) {
    be_.begin(stream, false);
    return calls_.begin<T, full_precision_stage>(count, what);
  }
  /// Frames of `n` values start 16-byte aligned (the transfers move 16-byte words).
  static std::size_t slot_bytes(std::size_t n) {
    return (H + n * sizeof(T) + 15) & ~std::size_t(15);
  }
  /// The headers of the G frames of a call in the receive window, `slot` bytes apart.
  kernels::header_check frames(std::size_t slot, const call_check& cc) const {
    header_set s;
    s.first = recv_.data();
    s.stride = slot;
    s.count = G_;
    s.want = cc.want;
    return be_.device_check(s);
  }
  /// Adds one header to write; launches `c` when it is full.
  void stamp(kernels::raw_copy<T>& c, std::byte* at, cudaStream_t stream) {
    if (c.stamps == kernels::raw_max_stamps) flush(c, {}, stream);
    c.at[c.stamps++] = at;
  }
  /// Adds one piece to copy; launches `c` when it is full.
  void piece(kernels::raw_copy<T>& c, const T* from, T* to, std::size_t n,
             const kernels::header_check& check, cudaStream_t stream) {
    if (n == 0) return;
    if (c.pieces == kernels::raw_max_pieces) flush(c, check, stream);
    c.src[c.pieces] = from;
    c.dst[c.pieces] = to;
    c.n[c.pieces++] = n;
  }
  /// Launches what `c` holds and empties it (the header it writes stays).
  void flush(kernels::raw_copy<T>& c, const kernels::header_check& check, cudaStream_t stream) {
    kernels::copy_raw(c, check, stream);
    c.pieces = c.stamps = 0;
  }

  impl be_;
  int G_, me_;
  stage_calls calls_;
  bool reported_ = false;
  impl::transfer_buffer send_, recv_;
  device_buffer<T> scratch_;  ///< the sum of a call whose pieces are not contiguous
  std::vector<std::size_t> send_bytes_, send_off_, recv_bytes_, recv_off_, peer_off_;
};

}  // namespace lowbit::detail
