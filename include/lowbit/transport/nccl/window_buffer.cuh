// The NCCL backend's frame workspace: bytes that NCCL moves. With `symmetric` they come
// from ncclMemAlloc and are registered with the communicator as a symmetric window, so
// NCCL (2.27 and later) can run its symmetric-memory kernels on them, faster than on
// cudaMalloc memory at every size (transport-probe's sym_ag against allgather;
// docs/performance.md), and the peer stores and copy engines can address them.
// Registration and release are collective over the communicator, with the same size on
// every rank.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <string>
#include <utility>

#include "lowbit/comm/nccl_comm.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/nccl_try.hpp"

#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= 22700
#define LOWBIT_HAS_NCCL_WINDOWS 1
#else
#define LOWBIT_HAS_NCCL_WINDOWS 0
#endif

namespace lowbit::transport {

/// `bytes` zeroed device bytes, registered with `comm` as a symmetric NCCL window when
/// asked and the NCCL headers have windows (plain cudaMalloc memory otherwise), and also
/// with `also` when given (the copy-engine split: transport::copy_engines).
/// `owner`, when given, is the nccl_comm both belong to: once it is aborted the release
/// drops the registrations without deregistering, since ncclCommAbort freed both
/// communicators. Move-only.
class window_buffer {
 public:
  window_buffer() = default;
  window_buffer(ncclComm_t comm, std::size_t bytes, bool symmetric, ncclComm_t also = nullptr,
                const comm::nccl_comm* owner = nullptr)
      : size_(bytes), owner_(owner) {
    if (bytes == 0) return;
#if LOWBIT_HAS_NCCL_WINDOWS
    if (symmetric) {
      LOWBIT_NCCL_TRY(ncclMemAlloc(reinterpret_cast<void**>(&data_), bytes));
      nccl_mem_ = true;
      reg_[0] = register_with(comm);
      if (also != nullptr) reg_[1] = register_with(also);
    }
#else
    (void)comm;
    (void)symmetric;
    (void)also;
#endif
    if (data_ == nullptr) LOWBIT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&data_), bytes));
    LOWBIT_CUDA_TRY(cudaMemset(data_, 0, bytes));
    LOWBIT_CUDA_TRY(cudaDeviceSynchronize());
  }
  window_buffer(const window_buffer&) = delete;
  window_buffer& operator=(const window_buffer&) = delete;
  window_buffer(window_buffer&& o) noexcept { swap(o); }
  window_buffer& operator=(window_buffer&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  ~window_buffer() { release(); }

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  /// True when the bytes are a registered symmetric window.
  bool symmetric() const noexcept { return reg_[0].comm != nullptr; }
#if LOWBIT_HAS_NCCL_WINDOWS
  /// The window of the first communicator (null unless symmetric()).
  ncclWindow_t window() const noexcept { return reg_[0].window; }
#endif

 private:
  struct registration {
    ncclComm_t comm = nullptr;
#if LOWBIT_HAS_NCCL_WINDOWS
    ncclWindow_t window = nullptr;
#endif
  };

#if LOWBIT_HAS_NCCL_WINDOWS
  /// Registers data_ with `comm`; on failure frees everything and throws.
  registration register_with(ncclComm_t comm) {
    registration r;
    const ncclResult_t e =
        ncclCommWindowRegister(comm, data_, size_, &r.window, NCCL_WIN_COLL_SYMMETRIC);
    if (e != ncclSuccess && e != ncclInProgress) {
      release();
      throw nccl_error(__FILE__, __LINE__, static_cast<int>(e),
                       std::string("ncclCommWindowRegister failed: ") + ncclGetErrorString(e) +
                           " (collective_options::transport = frame_transport::nccl keeps "
                           "the workspace unregistered)");
    }
    r.comm = comm;
    return r;
  }
#endif

  void swap(window_buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(reg_, o.reg_);
    std::swap(nccl_mem_, o.nccl_mem_);
    std::swap(owner_, o.owner_);
  }
  void release() noexcept {
#if LOWBIT_HAS_NCCL_WINDOWS
    if (nccl_mem_) {
      const bool aborted = owner_ != nullptr && owner_->aborted();
      for (registration& r : reg_)
        if (r.comm != nullptr && r.window != nullptr && !aborted)
          LOWBIT_NCCL_TRY_NO_THROW(ncclCommWindowDeregister(r.comm, r.window));
      LOWBIT_NCCL_TRY_NO_THROW(ncclMemFree(data_));
      data_ = nullptr;
    }
#endif
    if (data_ != nullptr) LOWBIT_CUDA_TRY_NO_THROW(cudaFree(data_));
    data_ = nullptr;
    size_ = 0;
    reg_[0] = reg_[1] = registration{};
    nccl_mem_ = false;
  }

  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  registration reg_[2];    ///< [0] the backend's communicator, [1] its copy-engine split
  bool nccl_mem_ = false;  ///< data_ came from ncclMemAlloc
  const comm::nccl_comm* owner_ = nullptr;  ///< aborted: skip the deregistration
};

}  // namespace lowbit::transport
