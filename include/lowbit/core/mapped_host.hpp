// Pinned host memory mapped into the device's address space, owned: what a kernel writes
// for the host to read without a copy or a synchronisation (a frame header that
// disagreed, a wait that ended early), or the host writes for running kernels to see (a
// communicator's abort word). Needs the CUDA runtime.
#pragma once

#include <cuda_runtime_api.h>

#include <utility>

#include "lowbit/core/error.hpp"

namespace lowbit::detail {

/// One zeroed U in pinned host memory mapped into the device's address space: kernels write
/// it directly and the host reads it without a copy or a synchronisation (the kernels'
/// rare reports, such as a frame header that disagreed). Move-only.
template <class U>
class mapped_host {
 public:
  mapped_host() = default;
  static mapped_host create() {
    mapped_host m;
    LOWBIT_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&m.p_), sizeof(U), cudaHostAllocMapped));
    *m.p_ = U{};
    return m;
  }
  mapped_host(mapped_host&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  mapped_host& operator=(mapped_host&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  ~mapped_host() { reset(); }
  /// The object, for the host and (unified addressing) for kernels alike.
  U* get() const noexcept { return p_; }

 private:
  void reset() noexcept {
    if (p_) LOWBIT_CUDA_TRY_NO_THROW(cudaFreeHost(p_));
    p_ = nullptr;
  }
  U* p_ = nullptr;
};

}  // namespace lowbit::detail
