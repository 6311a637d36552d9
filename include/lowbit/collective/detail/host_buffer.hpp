// An owning, zero-initialised, 64-byte aligned host array: the MPI backend's workspace.
#pragma once

#include <cstddef>
#include <cstring>
#include <new>
#include <utility>

namespace lowbit::detail {

/// n zeroed U in 64-byte aligned host memory. Move-only.
template <class U>
class host_buffer {
 public:
  host_buffer() = default;
  explicit host_buffer(std::size_t n) : size_(n) {
    if (n > 0) {
      data_ = static_cast<U*>(::operator new (n * sizeof(U), std::align_val_t{64}));
      zero();
    }
  }
  host_buffer(const host_buffer&) = delete;
  host_buffer& operator=(const host_buffer&) = delete;
  host_buffer(host_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  host_buffer& operator=(host_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~host_buffer() { release(); }

  U* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  /// Sets every byte to 0.
  void zero() {
    if (data_) std::memset(static_cast<void*>(data_), 0, size_ * sizeof(U));
  }

 private:
  void release() noexcept {
    if (data_) ::operator delete (static_cast<void*>(data_), std::align_val_t{64});
    data_ = nullptr;
    size_ = 0;
  }
  U* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace lowbit::detail
