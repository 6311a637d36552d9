// transport::ipc_mover: what moves a collective's frames on the node backend. Every
// transfer is one kernel on the given stream that stores this rank's frames into its peers'
// windows (transport::ipc_window, CUDA IPC), ordered by flags in a small symmetric window:
//
//   1 arrive  each CTA c writes epoch e into every peer's arrive[c][me] and waits until its
//             own arrive[c][p] >= e for every peer p. A rank arrives when its stream reaches
//             the transfer, so everything its stream ordered before (its reads of the regions
//             the peers are about to overwrite) is done.
//   2 store   CTA c copies its slice of every peer's frame into that peer's window.
//   3 land    a system-scope fence, then e into every peer's landed[c][me]; it waits until
//             its own landed[c][p] >= e: every peer's frame for this rank is here.
//
// e is CTA c's transfer counter, kept in device memory and advanced by the kernel itself:
// every rank runs the same transfers in the same order, so the counters agree; they only
// grow, so a flag from an earlier transfer is never taken for this one; and a call captured
// in a CUDA graph advances them on every replay (nothing is baked in at capture).
//
// Waits end in bounded time: at the deadline (the collective's timeout, measured on the
// GPU's global timer) or when the communicator's abort word is set, the kernel records
// which peer it waited for (the communicator's wait record, mapped host memory, read by the
// backend's sync()), stores
// nothing more, and clears the header of every frame it was still expecting, so the codec
// kernels after it find no frame of this call and write nothing to the output.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "lowbit/comm/node_comm.hpp"
#include "lowbit/core/config.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/transport/ipc/ipc_window.hpp"

namespace lowbit::transport {

/// One peer's part of a transfer: `bytes` at `src` (this rank's window) go to `dst` (the
/// peer's window, mapped here); `expect` (this rank's window, or null) is where the peer's
/// frame for this rank lands: its header is cleared if the frame never does.
struct ipc_put {
  const std::byte* src;
  std::byte* dst;
  std::size_t bytes;
  std::byte* expect;
};

/// A transfer kernel's parameters (passed by value: graph-capturable).
struct ipc_transfer_args {
  ipc_put put[comm::node_max_ranks];
  unsigned long long* flags[comm::node_max_ranks];  ///< every rank's flag window, mapped here
  unsigned long long* epoch;                        ///< this rank's counters, one per CTA
  const volatile int* abort_word;                   ///< the communicator's
  comm::node_wait_record* record;                   ///< the communicator's
  unsigned long long timeout_ns;                    ///< 0: wait forever (until aborted)
  int ranks, rank, ctas;
};

/// Threads per CTA of the transfer kernel (at least node_max_ranks: a thread per peer).
inline constexpr int ipc_threads = 512;
static_assert(ipc_threads >= comm::node_max_ranks);

/// Index of (phase, cta, from) in a flag window of `ranks` ranks and `ctas` CTAs.
LOWBIT_HD constexpr std::size_t ipc_flag_index(int phase, int cta, int from, int ranks, int ctas) {
  return (static_cast<std::size_t>(phase) * ctas + cta) * ranks + from;
}
/// Bytes of a flag window: two phases of flags, then this rank's counters.
constexpr std::size_t ipc_flag_bytes(int ranks, int ctas) {
  return sizeof(unsigned long long) *
         (ipc_flag_index(2, 0, 0, ranks, ctas) + static_cast<std::size_t>(ctas));
}

namespace detail {

__device__ inline unsigned long long load_acquire_sys(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ inline void store_release_sys(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ inline unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Waits until *flag >= e; false at the deadline or once the communicator is aborted.
__device__ inline bool ipc_wait(const unsigned long long* flag, unsigned long long e,
                                const ipc_transfer_args& a) {
  const unsigned long long start = global_ns();
  for (unsigned int spin = 0;; ++spin) {
    if (load_acquire_sys(flag) >= e) return true;
    if ((spin & 63u) == 63u) {  // the abort word is host memory: ask rarely
      if (*a.abort_word != 0) return false;
      if (a.timeout_ns != 0 && global_ns() - start > a.timeout_ns) return false;
    }
    __nanosleep(256);
  }
}

__device__ inline void ipc_note(const ipc_transfer_args& a, int peer, int phase) {
  if (atomicCAS_system(&a.record->claimed, 0u, 1u) != 0u) return;
  a.record->peer = peer;
  a.record->phase = phase;
  __threadfence_system();
  atomicExch_system(&a.record->ready, 1u);
}

/// Clears the header of the frame this rank expected from `peer` (32 bytes: magic 0).
__device__ inline void ipc_forget(const ipc_transfer_args& a, int peer) {
  if (a.put[peer].expect == nullptr) return;
  auto* h = reinterpret_cast<unsigned long long*>(a.put[peer].expect);
  for (int i = 0; i < 4; ++i) h[i] = 0;
}

/// Copies bytes [begin, end) of `p`; `begin` is a multiple of 16 (16-byte words where both
/// sides are aligned, as the backends' windows and frames are).
__device__ inline void ipc_copy(const ipc_put& p, std::size_t begin, std::size_t end) {
  const bool aligned =
      ((reinterpret_cast<std::uintptr_t>(p.src) | reinterpret_cast<std::uintptr_t>(p.dst)) & 15u) ==
      0;
  std::size_t i = begin + threadIdx.x;
  if (aligned) {
    const auto* s = reinterpret_cast<const uint4*>(p.src);
    auto* d = reinterpret_cast<uint4*>(p.dst);
    for (std::size_t w = begin / 16 + threadIdx.x; w < end / 16; w += blockDim.x) d[w] = s[w];
    i = end / 16 * 16 + threadIdx.x;
  }
  for (; i < end; i += blockDim.x) p.dst[i] = p.src[i];
}

/// The transfer (file comment). CTA c copies slice c of every peer's frame.
template <int Threads>
__global__ void __launch_bounds__(Threads) ipc_transfer_kernel(const ipc_transfer_args a) {
  __shared__ unsigned long long epoch;
  __shared__ int ok;
  const int c = static_cast<int>(blockIdx.x), t = static_cast<int>(threadIdx.x);
  if (t == 0) {
    epoch = a.epoch[c] + 1;
    a.epoch[c] = epoch;
    ok = 1;
  }
  __syncthreads();
  const unsigned long long e = epoch;
  const bool peer_thread = t < a.ranks && t != a.rank;
  if (peer_thread) {
    __threadfence_system();
    store_release_sys(a.flags[t] + ipc_flag_index(0, c, a.rank, a.ranks, a.ctas), e);
    if (!ipc_wait(a.flags[a.rank] + ipc_flag_index(0, c, t, a.ranks, a.ctas), e, a)) {
      ok = 0;
      ipc_note(a, t, 0);
    }
  }
  __syncthreads();
  if (ok == 0) {  // a peer is missing: store nothing, expect nothing
    if (peer_thread) ipc_forget(a, t);
    return;
  }
  for (int k = 1; k < a.ranks; ++k) {
    const ipc_put& p = a.put[(a.rank + k) % a.ranks];
    if (p.bytes == 0) continue;
    const std::size_t slice = (p.bytes + 16 * a.ctas - 1) / (16 * a.ctas) * 16;
    const std::size_t begin = slice * c < p.bytes ? slice * c : p.bytes;
    const std::size_t end = begin + slice < p.bytes ? begin + slice : p.bytes;
    ipc_copy(p, begin, end);
  }
  __threadfence_system();
  __syncthreads();
  if (peer_thread) {
    store_release_sys(a.flags[t] + ipc_flag_index(1, c, a.rank, a.ranks, a.ctas), e);
    if (!ipc_wait(a.flags[a.rank] + ipc_flag_index(1, c, t, a.ranks, a.ctas), e, a)) {
      ipc_note(a, t, 1);
      ipc_forget(a, t);
    }
  }
}

}  // namespace detail

/// Moves frames between the ranks of one node_comm, which must outlive it. Move-only (its
/// members are).
class ipc_mover {
 public:
  /// CTAs of every transfer kernel (the same on every rank).
  static constexpr int ctas = 16;

  ipc_mover() = default;
  /// Collective over `comm`: the flag window.
  ipc_mover(const comm::node_comm& comm, const char* who)
      : comm_(&comm), flags_(comm, ipc_flag_bytes(comm.size(), ctas), who) {}

  /// A window of `bytes` on every rank (collective).
  ipc_window make_buffer(std::size_t bytes, const char* who) const {
    return ipc_window(*comm_, bytes, who);
  }

  /// Stores send_bytes[p] at send + send_off[p] into peer p's `recv` window at
  /// peer_recv_off[p]; this rank's recv_bytes[p] from p land at recv + recv_off[p].
  void alltoallv(const ipc_window& send, const std::size_t* send_bytes, const std::size_t* send_off,
                 const ipc_window& recv, const std::size_t* recv_bytes, const std::size_t* recv_off,
                 const std::size_t* peer_recv_off, std::chrono::milliseconds timeout,
                 cudaStream_t s) const {
    ipc_transfer_args a = args(timeout);
    for (int p = 0; p < a.ranks; ++p) {
      if (p == a.rank) continue;
      a.put[p] = {send.data() + send_off[p], recv.peer(p) + peer_recv_off[p], send_bytes[p],
                  recv_bytes[p] > 0 ? recv.data() + recv_off[p] : nullptr};
    }
    launch(a, s);
  }

  /// In place: P slots of slot_bytes at `offset` of buf; slot `rank` is this rank's and goes
  /// to the same slot of every peer's window.
  void allgather(const ipc_window& buf, std::size_t offset, std::size_t slot_bytes,
                 std::chrono::milliseconds timeout, cudaStream_t s) const {
    ipc_transfer_args a = args(timeout);
    const std::size_t mine = offset + static_cast<std::size_t>(a.rank) * slot_bytes;
    for (int p = 0; p < a.ranks; ++p) {
      if (p == a.rank) continue;
      a.put[p] = {buf.data() + mine, buf.peer(p) + mine, slot_bytes,
                  buf.data() + offset + static_cast<std::size_t>(p) * slot_bytes};
    }
    launch(a, s);
  }

 private:
  ipc_transfer_args args(std::chrono::milliseconds timeout) const {
    ipc_transfer_args a{};
    a.ranks = comm_->size();
    a.rank = comm_->rank();
    a.ctas = ctas;
    for (int p = 0; p < a.ranks; ++p)
      a.flags[p] = reinterpret_cast<unsigned long long*>(flags_.peer(p));
    a.epoch = reinterpret_cast<unsigned long long*>(flags_.data()) +
              ipc_flag_index(2, 0, 0, a.ranks, ctas);
    a.abort_word = comm_->abort_word();
    a.record = comm_->wait_record();
    a.timeout_ns = static_cast<unsigned long long>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count());
    return a;
  }
  static void launch(const ipc_transfer_args& a, cudaStream_t s) {
    if (a.ranks == 1) return;
    detail::ipc_transfer_kernel<ipc_threads><<<ctas, ipc_threads, 0, s>>>(a);
    LOWBIT_CHECK_LAUNCH();
  }
  const comm::node_comm* comm_ = nullptr;
  ipc_window flags_;  ///< arrive and landed flags, then this rank's counters
};

}  // namespace lowbit::transport
