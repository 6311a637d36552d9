// Owning device memory, pinned host memory and CUDA stream/event handles for the device
// backends (mapped host memory: core/mapped_host.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <utility>

#include "lowbit/core/error.hpp"
#include "lowbit/core/mapped_host.hpp"

namespace lowbit::detail {

/// Where a cuda_buffer lives: device memory (cudaMalloc: 256-byte aligned).
struct device_memory {
  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    LOWBIT_CUDA_TRY(cudaMalloc(&p, bytes));
    return p;
  }
  static void release(void* p) noexcept { LOWBIT_CUDA_TRY_NO_THROW(cudaFree(p)); }
  /// Zeroes and waits for it (construction and feedback resets only).
  static void zero(void* p, std::size_t bytes) {
    LOWBIT_CUDA_TRY(cudaMemset(p, 0, bytes));
    LOWBIT_CUDA_TRY(cudaDeviceSynchronize());
  }
};

/// Pinned (page-locked) host memory: what cudaMemcpyAsync moves to and from the device
/// without a bounce through a staging buffer, and what a host backend reads and writes.
struct pinned_memory {
  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    LOWBIT_CUDA_TRY(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
    return p;
  }
  static void release(void* p) noexcept { LOWBIT_CUDA_TRY_NO_THROW(cudaFreeHost(p)); }
  static void zero(void* p, std::size_t bytes) { std::memset(p, 0, bytes); }
};

/// n zeroed U in Memory (device_memory or pinned_memory). Move-only.
template <class U, class Memory>
class cuda_buffer {
 public:
  cuda_buffer() = default;
  explicit cuda_buffer(std::size_t n) : size_(n) {
    if (n > 0) {
      data_ = static_cast<U*>(Memory::allocate(n * sizeof(U)));
      zero();
    }
  }
  cuda_buffer(const cuda_buffer&) = delete;
  cuda_buffer& operator=(const cuda_buffer&) = delete;
  cuda_buffer(cuda_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  cuda_buffer& operator=(cuda_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~cuda_buffer() { release(); }

  U* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  /// Zeroes the buffer (device memory: and waits for it; construction and feedback resets
  /// only).
  void zero() {
    if (data_) Memory::zero(data_, size_ * sizeof(U));
  }

 private:
  void release() noexcept {
    if (data_) Memory::release(data_);
    data_ = nullptr;
    size_ = 0;
  }
  U* data_ = nullptr;
  std::size_t size_ = 0;
};

/// n zeroed U in device memory. Move-only.
template <class U>
using device_buffer = cuda_buffer<U, device_memory>;
/// n zeroed U in pinned host memory. Move-only.
template <class U>
using pinned_buffer = cuda_buffer<U, pinned_memory>;

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
