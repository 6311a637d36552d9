// Where every frame of a call goes: per chunk and peer, the frame sizes and the offsets in
// the send, receive and gather buffers, for the two algorithms (engine.hpp's schedules
// read them; the backends move the bytes). The same count gives the same layout on every
// rank, so each rank also knows where its frame lands in a peer's receive buffer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "lowbit/core/error.hpp"
#include "lowbit/schedule/schedule.hpp"

namespace lowbit::detail {

template <class Schedule>
class frame_plan {
 public:
  frame_plan() = default;
  /// Room for calls of up to `max_chunks` chunks over `ranks` ranks; this rank is `rank`;
  /// every frame has `header` bytes of frame_header before it.
  frame_plan(int max_chunks, int ranks, int rank, std::size_t header)
      : P_(ranks), rank_(rank), H_(header) {
    const std::size_t slots = static_cast<std::size_t>(max_chunks) * ranks;
    for (auto* v : {&send_bytes, &send_off, &recv_bytes, &recv_off, &peer_recv_off})
      v->assign(slots, 0);
    for (auto* v : {&gather_off, &gather_slot, &recv_base, &recv_stride})
      v->assign(static_cast<std::size_t>(max_chunks), 0);
  }

  /// Piece k of K of rank p's shard of a `count`-element tensor in blocks of B.
  schedule::range shard_piece(std::size_t count, std::size_t B, int p, int K, int k) const {
    return schedule::piece<Schedule>(schedule::shard(count, B, P_, p), B, K, k);
  }

  /// two_phase's layout of a `count`-value call (returns its chunks K). Chunk k, peer p at
  /// index k*P + p: the frame of p's piece k is sent from send_off (none for my own piece,
  /// which is encoded straight into its receive slot), received at recv_off (P slots of my
  /// piece's frame size from recv_base[k]), and re-encoded sums are all-gathered in P slots
  /// of gather_slot[k] bytes from gather_off[k]. Throws (a lowbit bug) if a buffer's
  /// capacity would be exceeded.
  template <class Codec>
  int two_phase(std::size_t count, std::size_t send_cap, std::size_t recv_cap,
                std::size_t gather_cap) {
    const std::size_t B = Codec::block_size;
    const int K = schedule::num_chunks<Schedule>(count, B, P_);
    std::size_t send = 0, recv = 0, gather = 0;
    for (int k = 0; k < K; ++k) {
      const std::size_t stride = frame_size<Codec>(shard_piece(count, B, rank_, K, k).count);
      std::size_t slot = 0;
      recv_base[k] = recv;
      recv_stride[k] = stride;
      for (int p = 0; p < P_; ++p) {
        const std::size_t i = static_cast<std::size_t>(k) * P_ + p;
        const std::size_t fb = frame_size<Codec>(shard_piece(count, B, p, K, k).count);
        slot = std::max(slot, fb);
        send_off[i] = send;
        send_bytes[i] = p == rank_ ? 0 : fb;  // my own piece goes straight to its slot
        send += send_bytes[i];
        recv_off[i] = recv + p * stride;
        recv_bytes[i] = p == rank_ ? 0 : stride;
      }
      recv += P_ * stride;
      gather_off[k] = gather;
      gather_slot[k] = slot;
      gather += P_ * slot;
    }
    // Where my frame for each peer lands in that peer's receive buffer: its layout is its
    // plan of the same call, chunk by chunk (a backend that writes into its peers' memory
    // needs it; two-sided ones ignore it).
    for (int p = 0; p < P_; ++p) {
      std::size_t base = 0;
      for (int k = 0; k < K; ++k) {
        const std::size_t stride = frame_size<Codec>(shard_piece(count, B, p, K, k).count);
        peer_recv_off[static_cast<std::size_t>(k) * P_ + p] = base + rank_ * stride;
        base += P_ * stride;
      }
    }
    if (send > send_cap || recv > recv_cap || gather > gather_cap)
      LOWBIT_FAIL("workspace bound violated (a lowbit bug): send " + std::to_string(send) + "/" +
                  std::to_string(send_cap) + " recv " + std::to_string(recv) + "/" +
                  std::to_string(recv_cap) + " gather " + std::to_string(gather) + "/" +
                  std::to_string(gather_cap));
    return K;
  }

  /// one_shot's layout (returns its chunks K): piece k of the whole tensor has P slots of
  /// its frame's size from gather_off[k].
  template <class Codec>
  int one_shot(std::size_t count, std::size_t gather_cap) {
    const std::size_t B = Codec::block_size;
    const int K = schedule::num_chunks<Schedule>(count, B, 1);
    std::size_t gather = 0;
    for (int k = 0; k < K; ++k) {
      const std::size_t slot =
          frame_size<Codec>(schedule::piece<Schedule>({0, count}, B, K, k).count);
      gather_off[k] = gather;
      gather_slot[k] = slot;
      gather += P_ * slot;
    }
    if (gather > gather_cap)
      LOWBIT_FAIL("workspace bound violated (a lowbit bug): one-shot gather " +
                  std::to_string(gather) + "/" + std::to_string(gather_cap));
    return K;
  }

  std::vector<std::size_t> send_bytes, send_off, recv_bytes, recv_off, peer_recv_off;  ///< [k*P+p]
  std::vector<std::size_t> gather_off, gather_slot, recv_base, recv_stride;            ///< [k]

 private:
  /// A header and a frame of n values.
  template <class Codec>
  std::size_t frame_size(std::size_t n) const {
    return H_ + Codec::frame_bytes(n);
  }

  int P_ = 1, rank_ = 0;
  std::size_t H_ = 0;
};

}  // namespace lowbit::detail
