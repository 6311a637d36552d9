// transport::ipc_window: a symmetric buffer of the node backend. Every rank of a node_comm
// allocates the same number of bytes and maps every peer's with CUDA IPC, so a kernel of
// any rank can store into any rank's window (NVLink or PCIe P2P between GPUs; plain device
// memory where several ranks share one GPU).
//
// Construction is collective over the communicator's bootstrap, and fails alike on every
// rank (lowbit::invalid_argument naming the rank and the cause) when a rank could not
// allocate its window, when the ranks' sizes differ (their collectives were built with
// another max_count or options), or when a rank could not open a peer's handle: a rank
// that fails never leaves the others waiting.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "lowbit/comm/node_comm.hpp"
#include "lowbit/core/error.hpp"

namespace lowbit::transport {

/// `bytes` zeroed device bytes on every rank, each rank's mapped into every other's
/// address space. Move-only. Destruction unmaps the peers' windows and frees this one; it
/// is local (a peer's mapping keeps the memory alive until that peer unmaps it).
class ipc_window {
 public:
  ipc_window() = default;

  /// Collective over `comm` (every rank, the same `bytes`). `who` names the collective in
  /// the errors.
  ipc_window(const comm::node_comm& comm, std::size_t bytes, const char* who)
      : size_(bytes), rank_(comm.rank()) {
    const int P = comm.size();
    peers_.assign(static_cast<std::size_t>(P), nullptr);
    struct offer {
      cudaIpcMemHandle_t handle;
      unsigned long long bytes;
    };
    offer mine{};
    mine.bytes = bytes;
    std::string why;
    if (bytes > 0) {
      why = cuda_step(cudaMalloc(reinterpret_cast<void**>(&data_), bytes),
                      "could not allocate its " + std::to_string(bytes) + "-byte window");
      if (why.empty()) why = cuda_step(cudaMemset(data_, 0, bytes), "could not zero its window");
      if (why.empty()) why = cuda_step(cudaDeviceSynchronize(), "could not zero its window");
      if (why.empty() && P > 1)
        why = cuda_step(cudaIpcGetMemHandle(&mine.handle, data_),
                        "could not export its window (cudaIpcGetMemHandle)");
    }
    std::vector<offer> all(static_cast<std::size_t>(P));
    if (P > 1) comm.allgather(&mine, all.data(), sizeof mine);
    for (int p = 0; p < P && why.empty() && P > 1; ++p)
      if (all[static_cast<std::size_t>(p)].bytes != bytes)
        why = "its workspace is " + std::to_string(bytes) + " bytes where rank " +
              std::to_string(p) + "'s is " +
              std::to_string(all[static_cast<std::size_t>(p)].bytes) +
              " (the ranks built their collectives with different max_count or options)";
    agree_or_release(comm, why, who);
    peers_[static_cast<std::size_t>(rank_)] = data_;
    for (int p = 0; p < P && bytes > 0; ++p) {
      if (p == rank_ || !why.empty()) continue;
      void* mapped = nullptr;
      why =
          cuda_step(cudaIpcOpenMemHandle(&mapped, all[static_cast<std::size_t>(p)].handle,
                                         cudaIpcMemLazyEnablePeerAccess),
                    "could not map rank " + std::to_string(p) + "'s window (cudaIpcOpenMemHandle)");
      peers_[static_cast<std::size_t>(p)] = static_cast<std::byte*>(mapped);
    }
    agree_or_release(comm, why, who);
  }

  ipc_window(const ipc_window&) = delete;
  ipc_window& operator=(const ipc_window&) = delete;
  ipc_window(ipc_window&& o) noexcept { swap(o); }
  ipc_window& operator=(ipc_window&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  ~ipc_window() { release(); }

  /// This rank's window.
  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  /// Rank p's window as mapped in this process (this rank's own for p == rank).
  std::byte* peer(int p) const noexcept { return peers_[static_cast<std::size_t>(p)]; }

 private:
  /// Empty when `e` is success; else `what` with CUDA's words (and the error cleared, so it
  /// does not surface in an unrelated call).
  static std::string cuda_step(cudaError_t e, const std::string& what) {
    if (e == cudaSuccess) return {};
    (void)cudaGetLastError();
    return what + ": " + cudaGetErrorString(e);
  }

  /// Every rank's verdict (comm.agree); on failure this rank's window is released first.
  void agree_or_release(const comm::node_comm& comm, const std::string& why, const char* who) {
    try {
      if (comm.size() > 1)
        comm.agree(why, who);
      else if (!why.empty())
        throw invalid_argument(__FILE__, __LINE__, std::string(who) + ": " + why);
    } catch (...) {
      release();
      throw;
    }
  }

  void swap(ipc_window& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(rank_, o.rank_);
    std::swap(peers_, o.peers_);
  }
  void release() noexcept {
    for (std::size_t p = 0; p < peers_.size(); ++p)
      if (peers_[p] != nullptr && static_cast<int>(p) != rank_)
        LOWBIT_CUDA_TRY_NO_THROW(cudaIpcCloseMemHandle(peers_[p]));
    peers_.clear();
    if (data_ != nullptr) LOWBIT_CUDA_TRY_NO_THROW(cudaFree(data_));
    data_ = nullptr;
    size_ = 0;
  }

  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  int rank_ = 0;
  std::vector<std::byte*> peers_;  ///< every rank's window in this address space
};

}  // namespace lowbit::transport
