// The NCCL backend's frame workspace: bytes that NCCL moves. With `symmetric` they come
// from ncclMemAlloc and are registered with the communicator as a symmetric window, so
// NCCL (2.27 and later) can run its symmetric-memory kernels on them: its all-gather
// moved 321 GB/s instead of 273 GB/s at 256 MiB per rank over NVLink, and 282 instead of
// 190 GB/s at 16 MiB (transport-probe, docs/performance.md). Registration and release
// are collective over the communicator, with the same size on every rank.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <string>
#include <utility>

#include "lowbit/core/error.hpp"

#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= 22700
#define LOWBIT_HAS_NCCL_WINDOWS 1
#else
#define LOWBIT_HAS_NCCL_WINDOWS 0
#endif

namespace lowbit::detail {

/// `bytes` zeroed device bytes, registered with `comm` as a symmetric NCCL window when
/// asked and the NCCL headers have windows (plain cudaMalloc memory otherwise). Move-only.
class window_buffer {
 public:
  window_buffer() = default;
  window_buffer(ncclComm_t comm, std::size_t bytes, bool symmetric) : size_(bytes) {
    if (bytes == 0) return;
#if LOWBIT_HAS_NCCL_WINDOWS
    if (symmetric) {
      LOWBIT_NCCL_TRY(ncclMemAlloc(reinterpret_cast<void**>(&data_), bytes));
      comm_ = comm;
      const ncclResult_t r =
          ncclCommWindowRegister(comm, data_, bytes, &window_, NCCL_WIN_COLL_SYMMETRIC);
      if (r != ncclSuccess && r != ncclInProgress) {
        release();
        throw nccl_error(__FILE__, __LINE__, static_cast<int>(r),
                         std::string("ncclCommWindowRegister failed: ") + ncclGetErrorString(r) +
                             " (collective_options::transport = frame_transport::nccl keeps "
                             "the workspace unregistered)");
      }
    }
#else
    (void)comm;
    (void)symmetric;
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
  bool symmetric() const noexcept { return comm_ != nullptr; }
#if LOWBIT_HAS_NCCL_WINDOWS
  /// The window (null unless symmetric()).
  ncclWindow_t window() const noexcept { return window_; }
#endif

 private:
  void swap(window_buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(comm_, o.comm_);
#if LOWBIT_HAS_NCCL_WINDOWS
    std::swap(window_, o.window_);
#endif
  }
  void release() noexcept {
#if LOWBIT_HAS_NCCL_WINDOWS
    if (comm_ != nullptr) {
      if (window_ != nullptr) LOWBIT_NCCL_TRY_NO_THROW(ncclCommWindowDeregister(comm_, window_));
      if (data_ != nullptr) LOWBIT_NCCL_TRY_NO_THROW(ncclMemFree(data_));
      window_ = nullptr;
      comm_ = nullptr;
      data_ = nullptr;
    }
#endif
    if (data_ != nullptr) LOWBIT_CUDA_TRY_NO_THROW(cudaFree(data_));
    data_ = nullptr;
    size_ = 0;
  }

  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  ncclComm_t comm_ = nullptr;  ///< set while data_ is a registered window
#if LOWBIT_HAS_NCCL_WINDOWS
  ncclWindow_t window_ = nullptr;
#endif
};

}  // namespace lowbit::detail
