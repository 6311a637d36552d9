// A wrapper around a raw ncclComm_t (RAFT comms style): borrowed by default, owned on
// request; a stream sync that polls NCCL's asynchronous error and aborts the
// communicator instead of hanging. It also holds what every collective on the
// communicator shares for its frame transports (lowbit/transport/): the split the copy
// engines run on and whether the peers' memory is mapped, each made once, since both are
// collective and slow (docs/design.md, "Frames live in symmetric NCCL windows").
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "lowbit/comm/stream_wait.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/nccl_try.hpp"
#include "lowbit/core/numeric.hpp"

namespace lowbit::comm {

/// NCCL's name for lowbit's element type T (float, __half or __nv_bfloat16).
template <class T>
constexpr ncclDataType_t nccl_data_type() {
  static_assert(is_element_type_v<T>,
                "lowbit::comm::nccl_data_type: T must be float, __half or __nv_bfloat16");
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
#if LOWBIT_HAS_CUDA_HALF
  else if constexpr (std::is_same_v<T, __half>)
    return ncclFloat16;
#endif
  else
    return ncclBfloat16;
}

/// Whether an nccl_comm destroys its handle.
enum class ownership { borrowed, owned };

/// An NCCL communicator: the raw handle, with rank and size taken from NCCL.
///
/// Borrowed by default: the caller (e.g. PyTorch's ProcessGroupNCCL) keeps ownership
/// and the handle must outlive this object and every collective built on it. With
/// ownership::owned the destructor calls ncclCommDestroy (ncclCommAbort after an
/// error). Destroy CUDA graph execs that captured work on a communicator before
/// destroying it: ncclCommDestroy waits for that work and can hang. Move-only.
///
/// Threading: the calls that create its shared state (copy_engines_comm(), peers_mapped(),
/// and so the collectives' constructors) are collective and unsynchronized: make them from
/// one host thread per rank, in the same order on every rank.
class nccl_comm {
 public:
  /// An empty communicator (size 0): collectives refuse it.
  nccl_comm() = default;

  /// Wraps `comm`; rank and size are queried from NCCL.
  explicit nccl_comm(ncclComm_t comm, ownership own = ownership::borrowed)
      : comm_(comm), owns_(own == ownership::owned) {
    LOWBIT_EXPECTS(comm != nullptr, "nccl_comm: the ncclComm_t is null");
    LOWBIT_NCCL_TRY(ncclCommUserRank(comm, &rank_));
    LOWBIT_NCCL_TRY(ncclCommCount(comm, &size_));
  }

  nccl_comm(const nccl_comm&) = delete;
  nccl_comm& operator=(const nccl_comm&) = delete;
  nccl_comm(nccl_comm&& o) noexcept { swap(o); }
  nccl_comm& operator=(nccl_comm&& o) noexcept {
    if (this != &o) {
      nccl_comm tmp(std::move(o));
      swap(tmp);
    }
    return *this;
  }
  ~nccl_comm() { release(); }

  /// The raw handle (nullptr when empty or aborted).
  ncclComm_t get() const noexcept { return comm_; }
  int rank() const noexcept { return rank_; }
  /// Number of ranks; 0 when empty.
  int size() const noexcept { return size_; }
  bool owns() const noexcept { return owns_; }
  /// True once abort() ran (after an asynchronous error, a timeout, or by request).
  bool aborted() const noexcept { return aborted_; }
  /// True when the communicator can carry a collective (not empty, not aborted).
  bool valid() const noexcept { return comm_ != nullptr && size_ > 0 && !aborted_; }

  /// NCCL's asynchronous error state (ncclSuccess or ncclInProgress when healthy).
  ncclResult_t async_error() const noexcept {
    if (comm_ == nullptr) return ncclInvalidArgument;
    ncclResult_t r = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &r);
    return q != ncclSuccess ? q : r;
  }

  /// Throws lowbit::invalid_argument unless the communicator is usable: empty (size
  /// 0), aborted, or holding an asynchronous error. Called by every collective before
  /// it sends a byte.
  void check(const char* who) const {
    LOWBIT_EXPECTS(comm_ != nullptr && size_ > 0,
                   std::string(who) + ": the NCCL communicator is empty (size 0)");
    LOWBIT_EXPECTS(!aborted_, std::string(who) + ": the NCCL communicator was aborted");
    const ncclResult_t e = async_error();
    LOWBIT_EXPECTS(e == ncclSuccess || e == ncclInProgress,
                   std::string(who) + ": the NCCL communicator is dead (asynchronous error: " +
                       ncclGetErrorString(e) + ")");
  }

  /// The communicator frame_transport::copy_engines runs its all-gathers on: a split of
  /// this one made by `make(get())` (a callable returning an ncclComm_t this object then
  /// owns, or null where NCCL cannot make one; lowbit::transport::copy_engines_comm(*this)
  /// passes the zero-CTA split). The first call that gets a handle keeps it, collectively
  /// over the communicator (every rank calls it); later calls return the same handle, so
  /// every collective on this communicator shares it. Owned by this object whether or not
  /// the parent is: destroyed before the parent handle, aborted with it by abort(). Throws
  /// lowbit::invalid_argument where check() would, and what `make` throws.
  template <class Make>
  ncclComm_t copy_engines_comm(Make&& make) const {
    check("nccl_comm::copy_engines_comm");
    if (copy_engines_ == nullptr) copy_engines_ = make(comm_);
    return copy_engines_;
  }

  /// Whether every peer's memory is mapped into this rank's address space (NVLink or PCIe
  /// P2P), which frame_transport::automatic needs for the copy engines, as `probe(get())`
  /// answers it (a callable returning bool): the first call runs its probe, later calls
  /// return that answer without running theirs. lowbit's NCCL backend probes by creating
  /// the peer stores' device communicator, which is collective, so every rank must make the
  /// first call alike; caching it spares the next collectives that cost.
  template <class Probe>
  bool peers_mapped(Probe&& probe) const {
    if (!peers_mapped_.has_value()) peers_mapped_ = static_cast<bool>(probe(comm_));
    return *peers_mapped_;
  }

  /// Aborts the communicator, its copy-engine split first: pending NCCL work is cancelled and
  /// the handles freed (a borrowed one too: it is unusable after an error anyway).
  /// Idempotent. Const because collectives hold the wrapper by const reference and must
  /// abort it on a timeout; the wrapper then refuses every collective.
  void abort() const noexcept {
    if (comm_ != nullptr && !aborted_) {
      if (copy_engines_ != nullptr) ncclCommAbort(copy_engines_);
      copy_engines_ = nullptr;
      ncclCommAbort(comm_);
      aborted_ = true;
    }
  }

  /// Waits until `stream` is idle, polling cudaStreamQuery and, while it is busy,
  /// ncclCommGetAsyncError: on an NCCL error the communicator is aborted and
  /// lowbit::nccl_error thrown, after `timeout` (if positive) it is aborted and
  /// lowbit::timeout_error thrown, instead of hanging forever on a peer that died or
  /// never called. A CUDA error throws lowbit::cuda_error.
  void sync(cudaStream_t stream,
            std::chrono::milliseconds timeout = std::chrono::milliseconds::zero()) const;

 private:
  void release() noexcept {
    // The split before its parent; abort() already freed it.
    if (copy_engines_ != nullptr) LOWBIT_NCCL_TRY_NO_THROW(ncclCommDestroy(copy_engines_));
    copy_engines_ = nullptr;
    peers_mapped_.reset();
    if (comm_ != nullptr && owns_ && !aborted_) LOWBIT_NCCL_TRY_NO_THROW(ncclCommDestroy(comm_));
    comm_ = nullptr;
    rank_ = size_ = 0;
    owns_ = aborted_ = false;
  }
  void swap(nccl_comm& o) noexcept {
    std::swap(comm_, o.comm_);
    std::swap(rank_, o.rank_);
    std::swap(size_, o.size_);
    std::swap(owns_, o.owns_);
    std::swap(aborted_, o.aborted_);
    std::swap(copy_engines_, o.copy_engines_);
    std::swap(peers_mapped_, o.peers_mapped_);
  }

  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 0;
  bool owns_ = false;
  mutable bool aborted_ = false;
  mutable ncclComm_t copy_engines_ = nullptr;  ///< made by the first copy_engines_comm()
  mutable std::optional<bool> peers_mapped_;   ///< answered by the first peers_mapped()
};

/// The first of `n` communicators holding an asynchronous NCCL error (index and error),
/// or {-1, ncclSuccess}: what a wait on their stream watches (comm::wait_stream).
struct nccl_failure {
  int which = -1;
  ncclResult_t error = ncclSuccess;
  bool operator()(const nccl_comm* const* comms, int n) {
    for (int i = 0; i < n; ++i) {
      const ncclResult_t e = comms[i]->async_error();
      if (e != ncclSuccess && e != ncclInProgress) {
        which = i;
        error = e;
        return true;
      }
    }
    return false;
  }
};

/// Waits until `stream` is idle, polling cudaStreamQuery and, while it is busy,
/// ncclCommGetAsyncError: on an NCCL error the communicator is aborted and
/// lowbit::nccl_error thrown, after `timeout` (if positive) it is aborted and
/// lowbit::timeout_error thrown, instead of hanging forever on a peer that died or
/// never called. A CUDA error throws lowbit::cuda_error.
inline void nccl_comm::sync(cudaStream_t stream, std::chrono::milliseconds timeout) const {
  check("nccl_comm::sync");
  const nccl_comm* self = this;
  nccl_failure f;
  const stream_wait w = wait_stream(stream, timeout, [&] { return f(&self, 1); });
  if (w == stream_wait::idle) return;
  abort();
  if (w == stream_wait::failed)
    throw nccl_error(__FILE__, __LINE__, static_cast<int>(f.error),
                     std::string("nccl_comm::sync: asynchronous NCCL error, communicator "
                                 "aborted: ") +
                         ncclGetErrorString(f.error));
  throw timeout_error(__FILE__, __LINE__,
                      "nccl_comm::sync: timed out after " + std::to_string(timeout.count()) +
                          " ms; communicator aborted");
}

}  // namespace lowbit::comm
