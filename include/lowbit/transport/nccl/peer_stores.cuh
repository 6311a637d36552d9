// frame_transport::peer_stores: an all-gather over load/store-accessible peers (NCCL's
// device API, 2.28 and later). A kernel stores this rank's slot straight into every
// peer's symmetric window over NVLink, between two LSA barriers. Alone it is the fastest
// kernel transfer, but its CTAs compete with the codec (transport::policy says when
// automatic uses it; transport-probe's lsa_push, docs/performance.md).
//
// Ordering: the first barrier (acquire/release) means every peer has finished the work
// its streams ordered before this transfer, in particular reading the slots we are about
// to overwrite; the second means every peer's slot has landed in our window before the
// kernel ends, so whatever the stream runs next may read it.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "lowbit/comm/nccl_comm.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/nccl_try.hpp"
#include "lowbit/transport/nccl/window_buffer.cuh"

#if LOWBIT_HAS_NCCL_WINDOWS && NCCL_VERSION_CODE >= 22800
#define LOWBIT_HAS_NCCL_LSA 1
#include <nccl_device.h>
#else
#define LOWBIT_HAS_NCCL_LSA 0
#endif

namespace lowbit::transport {

#if LOWBIT_HAS_NCCL_LSA

/// Threads per CTA of the push kernel.
inline constexpr int peer_store_threads = 512;

/// Copies n bytes src -> dst, where src and dst share their alignment modulo 16: bytes up
/// to the first 16-byte boundary, 16-byte words, then the tail.
__device__ inline void peer_store_copy(const std::byte* src, std::byte* dst, std::size_t n,
                                       std::size_t tid, std::size_t nthreads) {
  const std::size_t align = (16 - reinterpret_cast<std::uintptr_t>(src) % 16) % 16;
  const std::size_t head = align < n ? align : n;
  const std::size_t words = (n - head) / 16;
  const std::size_t tail = head + words * 16;
  if (tid < head) dst[tid] = src[tid];
  const auto* s = reinterpret_cast<const uint4*>(src + head);
  auto* d = reinterpret_cast<uint4*>(dst + head);
  for (std::size_t i = tid; i < words; i += nthreads) d[i] = s[i];
  if (tid < n - tail) dst[tail + tid] = src[tail + tid];
}

/// Slot r of [offset, offset + P * slot_bytes) in `win` is rank r's: push ours to every
/// peer. A template so that the header defines it in every translation unit.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    peer_store_allgather_kernel(ncclWindow_t win, std::size_t offset, std::size_t slot_bytes,
                                ncclDevComm dev) {
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), dev, ncclTeamLsa(dev), dev.lsaBarrier,
                                         blockIdx.x};
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
  const std::size_t mine = offset + static_cast<std::size_t>(dev.lsaRank) * slot_bytes;
  const auto* src = static_cast<const std::byte*>(ncclGetLsaPointer(win, mine, dev.lsaRank));
  const std::size_t tid = blockIdx.x * static_cast<std::size_t>(Threads) + threadIdx.x;
  const std::size_t nthreads = static_cast<std::size_t>(gridDim.x) * Threads;
  for (int k = 1; k < dev.lsaSize; ++k) {
    const int peer = (dev.lsaRank + k) % dev.lsaSize;
    peer_store_copy(src, static_cast<std::byte*>(ncclGetLsaPointer(win, mine, peer)), slot_bytes,
                    tid, nthreads);
  }
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

#endif  // LOWBIT_HAS_NCCL_LSA

/// Peer stores over `comm`: a device communicator with one LSA barrier per push CTA, when
/// every rank of `comm` is load/store accessible from this one (one NVLink domain) and
/// NCCL has the device API; disabled otherwise (PCIe without P2P, sockets, older NCCL),
/// where frame_mover uses ncclAllGather. Creation and destruction are collective.
/// `owner`, when given, is the nccl_comm that `comm` belongs to: once it is aborted the
/// destructor drops the device communicator without destroying it (ncclCommAbort freed its
/// parent). Move-only.
class peer_stores {
 public:
  peer_stores() = default;
  /// `ctas`: CTAs of the push kernel, one LSA barrier each (policy::peer_store_ctas).
  peer_stores(ncclComm_t comm, int ctas, const comm::nccl_comm* owner = nullptr) : owner_(owner) {
#if LOWBIT_HAS_NCCL_LSA
    int P = 0, rank = 0;
    LOWBIT_NCCL_TRY(ncclCommCount(comm, &P));
    LOWBIT_NCCL_TRY(ncclCommUserRank(comm, &rank));
    const ncclTeam_t lsa = ncclTeamLsa(comm);
    // Slot r belongs to comm rank r, so the LSA team must be the whole communicator in
    // rank order. Every rank sees the same team, so every rank decides alike.
    if (P < 2 || lsa.nRanks != P || lsa.rank != rank) return;
    ctas_ = ctas;
    ncclDevCommRequirements reqs{};
    reqs.lsaBarrierCount = ctas_;
    // The LSA team counts the node's ranks even where NCCL may not map peer memory
    // (NCCL_P2P_DISABLE=1): creation then fails alike on every rank, and the transfers
    // stay with NCCL's collectives.
    if (ncclDevCommCreate(comm, &reqs, &dev_) != ncclSuccess) return;
    comm_ = comm;
#else
    (void)comm, (void)ctas;
#endif
  }
  peer_stores(const peer_stores&) = delete;
  peer_stores& operator=(const peer_stores&) = delete;
  peer_stores(peer_stores&& o) noexcept { swap(o); }
  peer_stores& operator=(peer_stores&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  ~peer_stores() { release(); }

  /// True when allgather() may be used.
  bool enabled() const noexcept { return comm_ != nullptr; }

  /// In-place all-gather of P slots of `slot_bytes` at `offset` of the symmetric `buf`.
  void allgather(const window_buffer& buf, std::size_t offset, std::size_t slot_bytes,
                 cudaStream_t s) const {
#if LOWBIT_HAS_NCCL_LSA
    peer_store_allgather_kernel<peer_store_threads>
        <<<ctas_, peer_store_threads, 0, s>>>(buf.window(), offset, slot_bytes, dev_);
    LOWBIT_CHECK_LAUNCH();
#else
    (void)buf, (void)offset, (void)slot_bytes, (void)s;
#endif
  }

 private:
  void swap(peer_stores& o) noexcept {
    std::swap(comm_, o.comm_);
    std::swap(ctas_, o.ctas_);
    std::swap(owner_, o.owner_);
#if LOWBIT_HAS_NCCL_LSA
    std::swap(dev_, o.dev_);
#endif
  }
  void release() noexcept {
#if LOWBIT_HAS_NCCL_LSA
    if (comm_ != nullptr && !(owner_ != nullptr && owner_->aborted()))
      LOWBIT_NCCL_TRY_NO_THROW(ncclDevCommDestroy(comm_, &dev_));
#endif
    comm_ = nullptr;
  }

  ncclComm_t comm_ = nullptr;  ///< set while dev_ is a live device communicator
  int ctas_ = 0;
  const comm::nccl_comm* owner_ = nullptr;  ///< aborted: skip the destruction
#if LOWBIT_HAS_NCCL_LSA
  ncclDevComm dev_{};
#endif
};

}  // namespace lowbit::transport
