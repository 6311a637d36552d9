// Owning device memory and CUDA stream/event handles for the device backends (mapped host
// memory: core/mapped_host.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "lowbit/core/error.hpp"
#include "lowbit/core/mapped_host.hpp"

namespace lowbit::detail {

/// n zeroed U in device memory (cudaMalloc: 256-byte aligned). Move-only.
template <class U>
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t n) : size_(n) {
    if (n > 0) {
      LOWBIT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(U)));
      zero();
    }
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~device_buffer() { release(); }

  U* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  /// Zeroes the buffer and waits for it (construction and feedback resets only).
  void zero() {
    if (data_) {
      LOWBIT_CUDA_TRY(cudaMemset(data_, 0, size_ * sizeof(U)));
      LOWBIT_CUDA_TRY(cudaDeviceSynchronize());
    }
  }

 private:
  void release() noexcept {
    if (data_) LOWBIT_CUDA_TRY_NO_THROW(cudaFree(data_));
    data_ = nullptr;
    size_ = 0;
  }
  U* data_ = nullptr;
  std::size_t size_ = 0;
};

/// An owned non-blocking stream (null when not needed). Move-only.
class unique_stream {
 public:
  unique_stream() = default;
  static unique_stream create() {
    unique_stream s;
    LOWBIT_CUDA_TRY(cudaStreamCreateWithFlags(&s.s_, cudaStreamNonBlocking));
    return s;
  }
  /// A stream of the device's greatest priority: the block scheduler starts its kernels'
  /// CTAs before those of a kernel already queued on a normal stream.
  static unique_stream create_high_priority() {
    int least = 0, greatest = 0;
    LOWBIT_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    unique_stream s;
    LOWBIT_CUDA_TRY(cudaStreamCreateWithPriority(&s.s_, cudaStreamNonBlocking, greatest));
    return s;
  }
  unique_stream(unique_stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  unique_stream& operator=(unique_stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  ~unique_stream() { reset(); }
  cudaStream_t get() const noexcept { return s_; }

 private:
  void reset() noexcept {
    if (s_) LOWBIT_CUDA_TRY_NO_THROW(cudaStreamDestroy(s_));
    s_ = nullptr;
  }
  cudaStream_t s_ = nullptr;
};

/// An owned timing-free event. Move-only.
class unique_event {
 public:
  unique_event() = default;
  static unique_event create() {
    unique_event e;
    LOWBIT_CUDA_TRY(cudaEventCreateWithFlags(&e.e_, cudaEventDisableTiming));
    return e;
  }
  unique_event(unique_event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  unique_event& operator=(unique_event&& o) noexcept {
    if (this != &o) {
      reset();
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  ~unique_event() { reset(); }
  cudaEvent_t get() const noexcept { return e_; }

 private:
  void reset() noexcept {
    if (e_) LOWBIT_CUDA_TRY_NO_THROW(cudaEventDestroy(e_));
    e_ = nullptr;
  }
  cudaEvent_t e_ = nullptr;
};

}  // namespace lowbit::detail
