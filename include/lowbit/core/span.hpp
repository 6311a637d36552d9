// A pointer and a length: the view every host pass and collective takes.
#pragma once

#include <cstddef>
#include <utility>

#include "lowbit/core/config.hpp"

namespace lowbit {

/// A non-owning view of `size()` contiguous T (C++17 has no std::span).
template <class T>
class span {
 public:
  constexpr span() = default;
  LOWBIT_HD constexpr span(T* data, std::size_t size) : data_(data), size_(size) {}
  template <class U, std::size_t N>
  constexpr span(U (&array)[N]) : data_(array), size_(N) {}
  template <class Container, class = decltype(std::declval<Container&>().data())>
  constexpr span(Container& c) : data_(c.data()), size_(c.size()) {}

  LOWBIT_HD constexpr T* data() const { return data_; }
  LOWBIT_HD constexpr std::size_t size() const { return size_; }
  LOWBIT_HD constexpr bool empty() const { return size_ == 0; }
  LOWBIT_HD constexpr T& operator[](std::size_t i) const { return data_[i]; }
  LOWBIT_HD constexpr T* begin() const { return data_; }
  LOWBIT_HD constexpr T* end() const { return data_ + size_; }
  LOWBIT_HD constexpr span subspan(std::size_t offset, std::size_t count) const {
    return span(data_ + offset, count);
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace lowbit
