// What the device backends' collective tests share (NCCL's and the node backend's): device
// copies of host vectors, and the harness collective_cases.hpp runs its cases through.
// The including test defines g_comm (its communicator) and g_stream before including this.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "lowbit/collective/types.hpp"
#include "lowbit/core/error.hpp"

namespace lowbit::test {

/// A device copy of a host vector (or `n` uninitialised elements).
template <class T>
struct dvec {
  T* p = nullptr;
  std::size_t n = 0;
  explicit dvec(std::size_t n_) : n(n_) {
    if (n) LOWBIT_CUDA_TRY(cudaMalloc(&p, n * sizeof(T)));
  }
  explicit dvec(const std::vector<T>& h) : dvec(h.size()) {
    if (n) LOWBIT_CUDA_TRY(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    // A copy from pageable memory may return before its DMA lands, and the collectives run
    // on a non-blocking stream, which does not wait for it: wait here.
    LOWBIT_CUDA_TRY(cudaDeviceSynchronize());
  }
  dvec(const dvec&) = delete;
  ~dvec() {
    if (p) cudaFree(p);
  }
  void to(std::vector<T>& h) const {
    if (n) LOWBIT_CUDA_TRY(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  }
  /// Overwrites the first h.size() elements (and waits for the copy to land).
  void from(const std::vector<T>& h) {
    LOWBIT_CUDA_TRY(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    LOWBIT_CUDA_TRY(cudaDeviceSynchronize());
  }
  /// The first `count` elements.
  std::vector<T> get(std::size_t count) const {
    std::vector<T> h(count);
    LOWBIT_CUDA_TRY(cudaMemcpy(h.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

/// Runs calls on device copies of host vectors on g_stream, then waits with the
/// collective's own sync() (deadlines, recorded disagreements) and copies back.
template <class Backend, class Comm, const Comm& (*Get)(), cudaStream_t& Stream>
struct device_harness {
  using backend = Backend;
  static const Comm& comm() { return Get(); }
  static const Comm& empty_comm() {
    static const Comm c;
    return c;
  }
  template <class C, class T>
  static void call(C& c, const std::vector<T>& in, std::vector<T>& out, std::size_t count) {
    dvec<T> din(in), dout(out.size());
    c.async(din.p, dout.p, count, Stream);
    c.sync(Stream);
    dout.to(out);
  }
  template <class C, class T>
  static void call_in_place(C& c, std::vector<T>& buf, std::size_t in_off, std::size_t out_off,
                            std::size_t count) {
    dvec<T> d(buf);
    c.async(d.p + in_off, d.p + out_off, count, Stream);
    c.sync(Stream);
    d.to(buf);
  }
  template <class C>
  static void call_raw(C& c, const typename C::value_type* in, typename C::value_type* out,
                       std::size_t count) {
    using T = typename C::value_type;
    dvec<T> din(in ? count : 0), dout(out ? count : 0);
    c.async(din.p, dout.p, count, Stream);
    c.sync(Stream);
  }
  template <class C, class T>
  static void call_typed(C& c, const std::vector<T>& in, std::vector<T>& out, std::size_t count,
                         data_type type) {
    dvec<T> din(in), dout(out.size());
    c.async(static_cast<const void*>(din.p), static_cast<void*>(dout.p), count, type, Stream);
    c.sync(Stream);
    dout.to(out);
  }
  template <class C, class T>
  static void call_dynamic(C& c, const std::vector<T>& in, std::vector<T>& out, std::size_t count,
                           int bits) {
    dvec<T> din(in), dout(out.size());
    c.async(din.p, dout.p, count, bits, Stream);
    c.sync(Stream);
    dout.to(out);
  }
};

}  // namespace lowbit::test
