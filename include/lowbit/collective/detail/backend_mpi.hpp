// The host backend: host buffers, the host codec executor, MPI moving the frames.
// Every step runs to completion when issued, so the lanes and events are no-ops.
#pragma once

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "lowbit/collective/backend.hpp"
#include "lowbit/collective/detail/agreement.hpp"
#include "lowbit/collective/detail/engine.hpp"
#include "lowbit/collective/detail/host_buffer.hpp"
#include "lowbit/comm/mpi_comm.hpp"
#include "lowbit/core/float_ops.hpp"
#include "lowbit/host/codec_executor.hpp"

namespace lowbit::detail {

/// backend_impl<backend::mpi>'s members (collective/backend.hpp lists them).
class mpi_backend {
 public:
  using comm_type = comm::mpi_comm;
  /// The host backend has no streams: calls complete before they return.
  struct stream_type {};
  template <class U>
  using buffer = host_buffer<U>;
  using transfer_buffer = host_buffer<std::byte>;
  /// Calls complete before they return.
  static constexpr bool stream_ordered = false;
  /// The host executor sums a shard's frames in an fp32 scratch array.
  static constexpr bool needs_sum_scratch = true;
  /// No fallback: the host backend always runs the codec (it is the reference).
  static constexpr bool has_fallback = false;

  /// Every frame starts with a frame_header, checked by its receiver.
  static constexpr std::size_t header_bytes = sizeof(frame_header);
  /// Frames live in host memory: the engine reads every received header itself, after each
  /// transfer, so the codec steps below ignore their header sets.
  static constexpr bool host_frames = true;

  /// Collective: duplicates the communicator (MPI_Comm_dup), so lowbit's messages travel
  /// apart from the caller's and from other collective objects'.
  mpi_backend(const comm_type& comm, int /*events*/, int /*streams*/)
      : comm_(&comm), own_(comm_type::duplicate(comm.get())) {}

  static void check_comm(const comm_type& comm, const char* who) { comm.check(who); }
  /// Marks the communicator unusable for `why` (after a failed call: its channel may hold
  /// stray messages).
  static void poison(const comm_type& comm, const std::string& why) noexcept {
    try {
      comm.mark_unusable(why);
    } catch (...) {  // out of memory for the message: the call's own error still propagates
    }
  }
  /// MPI moves plain host memory: there is nothing to register or choose.
  void set_transport(frame_transport, const lowbit::transport::policy&, int /*widest_bits*/) {}
  static frame_transport transport() noexcept { return frame_transport::automatic; }
  static transfer_buffer make_transfer_buffer(std::size_t bytes) { return transfer_buffer(bytes); }
  static void check_sizes(std::size_t send, std::size_t recv, std::size_t gather) {
    LOWBIT_EXPECTS(send <= INT_MAX && recv <= INT_MAX && gather <= INT_MAX,
                   "lowbit (mpi backend): max_count too large: MPI counts are int, a frame "
                   "buffer would exceed 2 GiB");
  }
  void check_alive(const char* who) const { comm_->check(who); }

  /// out = in (a one-rank call); nothing when they alias exactly.
  template <class U>
  void copy(const U* in, U* out, std::size_t n, stream_type) {
    if (in != out && n > 0 && in != nullptr && out != nullptr) std::memmove(out, in, n * sizeof(U));
  }
  /// Calls complete before they return: nothing to wait for.
  void sync(stream_type, const call_check&) {}
  void set_check_stream(stream_type) {}
  /// Stamps a frame with this call's header.
  void stamp(lane, std::byte* slot, const frame_header& h, const header_set&) {
    std::memcpy(slot, &h, sizeof h);
  }
  /// The engine raises what it finds in the headers itself.
  static std::string disagreement() { return {}; }

  void begin(stream_type, bool /*overlap*/) {}
  void end() {}
  void signal(lane, int) {}
  void wait(lane, int) {}

  /// `header` goes in front of the frame (at frame - header_bytes).
  template <class Codec, class T, class Fb>
  void encode(lane, const T* x, std::size_t n, std::byte* frame, const rng_key& key,
              std::uint64_t index0, Fb fb, const frame_header& header) {
    std::memcpy(frame - header_bytes, &header, sizeof header);
    host::encode<Codec>(span<const T>(x, n), span<std::byte>(frame, Codec::frame_bytes(n)), key,
                        index0, fb);
  }

  template <class Codec, class U>
  void decode(lane, const std::byte* frame, std::size_t n, U* out, float scale,
              const header_set& = {}) {
    host::decode<Codec>(span<const std::byte>(frame, Codec::frame_bytes(n)), span<U>(out, n),
                        scale);
  }

  /// decoded_out (may be null) gets the new frame decoded, times scale; `header` goes in
  /// front of out_frame.
  template <class Codec, class Fb, class U>
  void reduce_encode(lane l, const std::byte* frames, std::size_t stride, int num_frames,
                     std::size_t n, std::byte* out_frame, const rng_key& key, std::uint64_t index0,
                     Fb fb, float* acc, U* decoded_out, float scale, const header_set&,
                     const frame_header& header) {
    std::memcpy(out_frame - header_bytes, &header, sizeof header);
    host::decode_accumulate_encode<Codec>(frames, stride, num_frames, span<float>(acc, n),
                                          span<std::byte>(out_frame, Codec::frame_bytes(n)), key,
                                          index0, fb);
    if (decoded_out != nullptr) decode<Codec>(l, out_frame, n, decoded_out, scale);
  }

  /// out = scale * (sum of the decoded frames), summed in fp32 in rank order.
  template <class Codec, class U>
  void reduce(lane, const std::byte* frames, std::size_t stride, int num_frames, std::size_t n,
              U* out, float scale, float* acc, const header_set&) {
    host::sum_frames<Codec>(frames, stride, num_frames, span<float>(acc, n), out, scale);
  }

  /// g += delta; out = g (EF21's replicated state and output).
  template <class U>
  void accumulate_output(lane, const float* delta, std::size_t n, float* g, U* out,
                         const header_set&) {
    for (std::size_t i = 0; i < n; ++i) {
      g[i] = fadd(g[i], delta[i]);
      out[i] = from_float<U>(g[i]);
    }
  }

  /// Sends each peer p its send_bytes[p] at send + send_off[p] and receives each peer's
  /// into recv + recv_off[p] (recv_bytes[p] expected); zero-byte entries are no message.
  void alltoallv(lane, const transfer_buffer& send_buf, const std::size_t* send_bytes,
                 const std::size_t* send_off, transfer_buffer& recv_buf,
                 const std::size_t* recv_bytes, const std::size_t* recv_off,
                 const std::size_t* /*peer_recv_off*/, call_check& cc) {
    const std::byte* send = send_buf.data();
    std::byte* recv = recv_buf.data();
    sends_.clear();
    recvs_.clear();
    for (int p = 0; p < comm_->size(); ++p) {
      if (send_bytes[p] > 0) sends_.push_back({p, send + send_off[p], send_bytes[p]});
      if (recv_bytes[p] > 0) recvs_.push_back({p, recv + recv_off[p], recv_bytes[p]});
    }
    transfer(tag_exchange, cc);
  }

  /// In place: slot `rank` of buf is this rank's contribution.
  void allgather(lane, transfer_buffer& buf, std::size_t offset, std::size_t slot_bytes,
                 int /*bits*/, call_check& cc) {
    sends_.clear();
    recvs_.clear();
    const int me = comm_->rank();
    std::byte* base = buf.data() + offset;
    for (int p = 0; p < comm_->size(); ++p) {
      if (p == me) continue;
      sends_.push_back({p, base + static_cast<std::size_t>(me) * slot_bytes, slot_bytes});
      recvs_.push_back({p, base + static_cast<std::size_t>(p) * slot_bytes, slot_bytes});
    }
    transfer(tag_gather, cc);
  }

  /// Every rank's `bytes` at `mine`, rank by rank (checked mode's fingerprints), within
  /// the deadline. The result lives until the next call.
  const std::byte* allgather_small(const void* mine, std::size_t bytes, call_check& cc) {
    const std::size_t me = static_cast<std::size_t>(comm_->rank());
    small_.assign(bytes * static_cast<std::size_t>(comm_->size()), std::byte{0});
    std::memcpy(small_.data() + me * bytes, mine, bytes);
    MPI_Request req = MPI_REQUEST_NULL;
    LOWBIT_MPI_TRY(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, small_.data(),
                                  static_cast<int>(bytes), MPI_BYTE, own_.get(), &req));
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      int done = 0;
      LOWBIT_MPI_TRY(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
      if (done) return small_.data();
      if (expired(start, cc)) {
        // A pending collective cannot be cancelled: its buffer is left to it, for good.
        abandoned_buffers().push_back(std::move(small_));
        fail_timeout(cc, "every rank's fingerprint (checked mode)");
      }
      std::this_thread::yield();
    }
  }

 private:
  static constexpr int tag_exchange = 1, tag_gather = 2;

  struct send_item {
    int peer;
    const std::byte* data;
    std::size_t bytes;
  };
  struct recv_item {
    int peer;
    std::byte* data;
    std::size_t bytes;
  };

  /// Buffers that a pending, uncancellable MPI operation may still write (after a timeout).
  static std::vector<std::vector<std::byte>>& abandoned_buffers() {
    static std::vector<std::vector<std::byte>> v;
    return v;
  }

  static bool expired(std::chrono::steady_clock::time_point start, const call_check& cc) {
    return cc.timeout.count() > 0 && std::chrono::steady_clock::now() - start > cc.timeout;
  }

  [[noreturn]] void fail_timeout(const call_check& cc, const std::string& waiting_for) {
    const std::string msg = cc.timeout_message(waiting_for);
    comm_->mark_unusable(msg);
    throw timeout_error(__FILE__, __LINE__, msg);
  }

  /// Sends sends_ and receives one message from every recvs_ peer on `tag`, skipping the
  /// peers `cc` already knows disagree. A message of another size than expected is
  /// received aside and reported through `cc` (with its header, when it has one): MPI
  /// never truncates, nothing outside the expected slot is written. Waits at most
  /// cc.timeout; on expiry the pending requests are abandoned, the communicator is
  /// marked unusable and lowbit::timeout_error names who was waited for.
  void transfer(int tag, call_check& cc) {
    MPI_Comm c = own_.get();
    reqs_.clear();
    for (const send_item& s : sends_) {
      if (cc.bad[static_cast<std::size_t>(s.peer)]) continue;
      MPI_Request r = MPI_REQUEST_NULL;
      LOWBIT_MPI_TRY(MPI_Isend(s.data, static_cast<int>(s.bytes), MPI_BYTE, s.peer, tag, c, &r));
      reqs_.push_back(r);
    }
    matched_.assign(recvs_.size(), 0);
    for (std::size_t i = 0; i < recvs_.size(); ++i)
      matched_[i] = cc.bad[static_cast<std::size_t>(recvs_[i].peer)];
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      bool all_matched = true;
      for (std::size_t i = 0; i < recvs_.size(); ++i) {
        if (matched_[i]) continue;
        const recv_item& r = recvs_[i];
        int flag = 0;
        MPI_Message msg = MPI_MESSAGE_NULL;
        MPI_Status st;
        LOWBIT_MPI_TRY(MPI_Improbe(r.peer, tag, c, &flag, &msg, &st));
        if (!flag) {
          all_matched = false;
          continue;
        }
        matched_[i] = 1;
        int n = 0;
        LOWBIT_MPI_TRY(MPI_Get_count(&st, MPI_BYTE, &n));
        if (static_cast<std::size_t>(n) == r.bytes) {
          MPI_Request q = MPI_REQUEST_NULL;
          LOWBIT_MPI_TRY(MPI_Imrecv(r.data, n, MPI_BYTE, &msg, &q));
          reqs_.push_back(q);
        } else {  // matched, so its sender is sending: this receive completes
          aside_.resize(static_cast<std::size_t>(n) + 1);
          LOWBIT_MPI_TRY(MPI_Mrecv(aside_.data(), n, MPI_BYTE, &msg, MPI_STATUS_IGNORE));
          std::string why = "rank " + std::to_string(r.peer) + " sent a frame of " +
                            std::to_string(n) + " bytes where this rank's call expects " +
                            std::to_string(r.bytes);
          if (static_cast<std::size_t>(n) >= sizeof(frame_header)) {
            const std::string m = mismatch(load_header(aside_.data()), cc.want, r.peer);
            if (!m.empty()) why = m + " (" + why + ")";
          }
          cc.note(r.peer, why);
        }
      }
      int done = 0;
      LOWBIT_MPI_TRY(
          MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &done, MPI_STATUSES_IGNORE));
      if (done && all_matched) return;
      if (expired(start, cc)) abandon(cc);
      std::this_thread::yield();
    }
  }

  /// The deadline passed: cancels what can be cancelled, frees the requests and throws.
  [[noreturn]] void abandon(const call_check& cc) {
    std::string peers;
    for (std::size_t i = 0; i < recvs_.size(); ++i)
      if (!matched_[i]) peers += (peers.empty() ? "" : ", ") + std::to_string(recvs_[i].peer);
    for (MPI_Request& r : reqs_) {
      if (r == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
    fail_timeout(cc, peers.empty() ? std::string("peers to receive this rank's frames")
                                   : "the frames of rank(s) " + peers);
  }

  const comm_type* comm_;
  comm_type own_;  ///< a private duplicate: no other traffic can match lowbit's messages
  std::vector<send_item> sends_;
  std::vector<recv_item> recvs_;
  std::vector<MPI_Request> reqs_;
  std::vector<char> matched_;
  std::vector<std::byte> aside_;  ///< a frame of unexpected size, received to be reported
  std::vector<std::byte> small_;  ///< allgather_small's result
};

}  // namespace lowbit::detail

namespace lowbit {
template <>
struct backend_impl<backend::mpi> : detail::mpi_backend {
  using detail::mpi_backend::mpi_backend;
};
static_assert(check_backend<backend_impl<backend::mpi>>());
}  // namespace lowbit
