// lowbit::comm::node_comm: the ranks of one node as processes that share GPU memory through
// CUDA IPC, without NCCL (the node backend, lowbit/collective/node.cuh). Several ranks may
// share one GPU: their contexts time-slice it, which is how multi-rank tests run on a
// one-GPU machine.
//
// A node_comm knows its rank and size, and a bootstrap: an all-gather over a channel the
// group already has (an MPI communicator, comm/node_mpi.hpp; a torch Store from Python).
// The bootstrap runs only while collectives are being built: to check that every rank is
// on this host and can reach every other rank's GPU, and to exchange the IPC handles of
// their workspace. IPC handles map memory, so they travel only over that channel, to the
// ranks of the group (never through files). Nothing in a call uses it.
//
// It also owns the communicator's abort word (mapped pinned memory): the node backend's
// waiting kernels poll it, so abort() (a timeout, an error, or by request) ends every wait
// of every collective on the communicator instead of leaving kernels spinning; and its wait
// record, where a kernel whose wait ended early (a deadline, an abort) says which rank it
// waited for: every collective on the communicator, and a hierarchical collective watching
// two communicators, learns of a failure from the communicator itself.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "lowbit/core/error.hpp"
#include "lowbit/core/mapped_host.hpp"

namespace lowbit::comm {

/// An all-gather over the group's own channel: every rank passes `bytes` at `mine` and
/// receives every rank's, rank by rank, at `all` (size * bytes). Collective: every rank
/// calls it with the same `bytes`, in the same order. It may throw.
using bootstrap_allgather = std::function<void(const void* mine, void* all, std::size_t bytes)>;

/// The most ranks a node_comm holds (the transfer kernels' peer tables are this long).
inline constexpr int node_max_ranks = 32;

/// What a wait that ended early leaves for the host (zero-initialised; mapped pinned).
struct node_wait_record {
  unsigned int claimed = 0;  ///< set by the one thread that writes the record
  unsigned int ready = 0;    ///< 1 once peer and phase are visible to the host
  int peer = -1;             ///< the rank waited for
  int phase = 0;             ///< 0: it never arrived at the transfer; 1: its frames never landed
};

/// What a rank tells the others about itself when the group forms.
struct node_rank_info {
  char host[64] = {};       ///< gethostname(), truncated
  std::int64_t pid = 0;     ///< the process
  int rank = -1, size = 0;  ///< as the rank believes them
  int device = -1;          ///< its CUDA ordinal (in its own process)
  int unused = 0;
  cudaUUID_t uuid = {};  ///< its GPU, the same name in every process
};

/// Why the ranks in `peers` (each as it described itself) cannot form a node group, as rank
/// `me` sees it; empty when they can. `reach(p)` says why this rank cannot map rank p's GPU
/// memory (empty when it can); it is asked only about ranks on another GPU. Pure: the host
/// tests call it with made-up groups.
inline std::string node_group_problem(const std::vector<node_rank_info>& peers, int me,
                                      const std::function<std::string(int)>& reach) {
  const int size = static_cast<int>(peers.size());
  const node_rank_info& mine = peers[static_cast<std::size_t>(me)];
  for (int p = 0; p < size; ++p) {
    const node_rank_info& q = peers[static_cast<std::size_t>(p)];
    const std::string who = "rank " + std::to_string(p);
    if (q.rank != p || q.size != size)
      return who + " says it is rank " + std::to_string(q.rank) + " of " + std::to_string(q.size) +
             " where the bootstrap makes it rank " + std::to_string(p) + " of " +
             std::to_string(size);
    if (std::strncmp(q.host, mine.host, sizeof q.host) != 0)
      return "the ranks are not on one node: " + who + " is on host '" +
             std::string(q.host, strnlen(q.host, sizeof q.host)) + "' and rank " +
             std::to_string(me) + " on '" +
             std::string(mine.host, strnlen(mine.host, sizeof mine.host)) +
             "' (the node backend maps its peers' GPU memory; across nodes use NCCL or MPI)";
    if (p != me && q.pid == mine.pid)
      return who + " is in this rank's process: the node backend needs one process per rank";
    if (p == me || std::memcmp(&q.uuid, &mine.uuid, sizeof q.uuid) == 0) continue;
    const std::string why = reach(p);
    if (!why.empty()) return who + ": " + why;
  }
  return {};
}

/// The ranks of one node over CUDA IPC. Move-only; the bootstrap channel must stay usable
/// while collectives are being built on this communicator (not during their calls).
class node_comm {
 public:
  /// An empty communicator (size 0): collectives refuse it.
  node_comm() = default;

  /// Forms the group: collective over `bootstrap` (every rank calls it, on the GPU it will
  /// use made current). Throws lowbit::invalid_argument on every rank, naming the cause, when
  /// the ranks are not on one host, two ranks are one process, a rank's GPU is not visible
  /// or not reachable (no peer access) from another's, or they disagree on rank or size.
  node_comm(int rank, int size, bootstrap_allgather bootstrap)
      : rank_(rank), size_(size), bootstrap_(std::move(bootstrap)) {
    LOWBIT_EXPECTS(size >= 1 && size <= node_max_ranks, "node_comm: size " + std::to_string(size) +
                                                            " is outside 1.." +
                                                            std::to_string(node_max_ranks));
    LOWBIT_EXPECTS(rank >= 0 && rank < size, "node_comm: rank " + std::to_string(rank) +
                                                 " is outside 0.." + std::to_string(size - 1));
    LOWBIT_EXPECTS(static_cast<bool>(bootstrap_), "node_comm: the bootstrap is empty");
    LOWBIT_CUDA_TRY(cudaGetDevice(&device_));
    abort_word_ = lowbit::detail::mapped_host<int>::create();
    missed_ = lowbit::detail::mapped_host<node_wait_record>::create();
    node_rank_info me;
    gethostname(me.host, sizeof me.host - 1);
    me.pid = static_cast<std::int64_t>(getpid());
    me.rank = rank;
    me.size = size;
    me.device = device_;
    cudaDeviceProp prop{};
    LOWBIT_CUDA_TRY(cudaGetDeviceProperties(&prop, device_));
    me.uuid = prop.uuid;
    peers_.resize(static_cast<std::size_t>(size));
    bootstrap_(&me, peers_.data(), sizeof me);
    agree(check_group(), "lowbit::comm::node_comm");
  }

  node_comm(const node_comm&) = delete;
  node_comm& operator=(const node_comm&) = delete;
  node_comm(node_comm&& o) noexcept { swap(o); }
  node_comm& operator=(node_comm&& o) noexcept {
    if (this != &o) {
      node_comm tmp(std::move(o));
      swap(tmp);
    }
    return *this;
  }

  int rank() const noexcept { return rank_; }
  /// Number of ranks; 0 when empty.
  int size() const noexcept { return size_; }
  /// This rank's CUDA device (current when the group formed).
  int device() const noexcept { return device_; }
  /// True when rank p's GPU is this rank's (several ranks share it).
  bool same_gpu(int p) const noexcept {
    return std::memcmp(&peers_[static_cast<std::size_t>(p)].uuid, &peers_[rank_].uuid,
                       sizeof(cudaUUID_t)) == 0;
  }
  /// True once abort() ran.
  bool aborted() const noexcept { return abort_word_.get() != nullptr && *abort_word_.get() != 0; }
  bool valid() const noexcept { return size_ > 0 && !aborted(); }
  /// The abort word the transfer kernels poll (device-accessible; non-zero once aborted).
  const volatile int* abort_word() const noexcept { return abort_word_.get(); }

  /// Where the transfer kernels record a wait that ended early (device-accessible).
  node_wait_record* wait_record() const noexcept { return missed_.get(); }
  /// Empty while no transfer on this communicator gave up a wait; else which rank it waited
  /// for, and for what.
  std::string missed() const {
    const volatile node_wait_record* r = missed_.get();
    if (r == nullptr || r->ready == 0) return {};
    return r->phase == 0 ? "rank " + std::to_string(r->peer) + " to arrive at a transfer"
                         : "the frames of rank " + std::to_string(r->peer) + " to land";
  }

  /// Throws lowbit::invalid_argument unless the communicator can carry a collective.
  void check(const char* who) const {
    LOWBIT_EXPECTS(size_ > 0, std::string(who) + ": the node communicator is empty (size 0)");
    LOWBIT_EXPECTS(!aborted(), std::string(who) +
                                   ": the node communicator was aborted (after a timeout or "
                                   "an error); build a new one");
  }

  /// Marks the communicator unusable and ends every wait of its kernels. Idempotent; const
  /// because collectives hold the communicator by const reference and abort it on a timeout.
  void abort() const noexcept {
    if (abort_word_.get() != nullptr) *abort_word_.get() = 1;
  }

  /// The bootstrap all-gather (collective; construction time only).
  void allgather(const void* mine, void* all, std::size_t bytes) const {
    LOWBIT_EXPECTS(static_cast<bool>(bootstrap_), "node_comm: empty communicator");
    bootstrap_(mine, all, bytes);
  }

  /// Collective: every rank passes its verdict; unless all are empty, every rank throws
  /// lowbit::invalid_argument with the first failing rank's words. A rank that failed
  /// locally (an allocation, an IPC open) thus never leaves the others waiting in a later
  /// exchange: everyone stops at this one.
  void agree(const std::string& why_not, const char* who) const {
    struct verdict {
      char why[240];
      int failed;
      int rank;
    };
    verdict mine{};
    mine.failed = why_not.empty() ? 0 : 1;
    mine.rank = rank_;
    std::strncpy(mine.why, why_not.c_str(), sizeof mine.why - 1);
    std::vector<verdict> all(static_cast<std::size_t>(size_));
    allgather(&mine, all.data(), sizeof mine);
    for (const verdict& v : all)
      if (v.failed != 0)
        throw invalid_argument(__FILE__, __LINE__,
                               std::string(who) + ": rank " + std::to_string(v.rank) + ": " +
                                   std::string(v.why, strnlen(v.why, sizeof v.why)));
  }

  /// What each rank said of itself when the group formed.
  const node_rank_info& info(int p) const { return peers_.at(static_cast<std::size_t>(p)); }

 private:
  /// Empty when the group can work; else why not, as this rank sees it.
  std::string check_group() const {
    return node_group_problem(peers_, rank_, [this](int p) -> std::string {
      const int ordinal = local_ordinal(peers_[static_cast<std::size_t>(p)].uuid);
      if (ordinal < 0)
        return "its GPU is not visible to this process (CUDA_VISIBLE_DEVICES): it cannot map "
               "that GPU's memory";
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, device_, ordinal) != cudaSuccess || can == 0) {
        (void)cudaGetLastError();
        return "peer access is unavailable between this rank's GPU " + std::to_string(device_) +
               " and its GPU " + std::to_string(ordinal) +
               " (no NVLink or PCIe P2P between them): use NCCL there";
      }
      return {};
    });
  }

  /// This process's ordinal of the GPU named `uuid`; -1 when it is not visible.
  static int local_ordinal(const cudaUUID_t& uuid) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return -1;
    for (int d = 0; d < n; ++d) {
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
      if (std::memcmp(&prop.uuid, &uuid, sizeof uuid) == 0) return d;
    }
    return -1;
  }

  void swap(node_comm& o) noexcept {
    std::swap(rank_, o.rank_);
    std::swap(size_, o.size_);
    std::swap(device_, o.device_);
    std::swap(bootstrap_, o.bootstrap_);
    std::swap(peers_, o.peers_);
    std::swap(abort_word_, o.abort_word_);
    std::swap(missed_, o.missed_);
  }

  int rank_ = 0;
  int size_ = 0;
  int device_ = -1;
  bootstrap_allgather bootstrap_;
  std::vector<node_rank_info> peers_;
  lowbit::detail::mapped_host<int> abort_word_;           ///< non-zero once aborted
  lowbit::detail::mapped_host<node_wait_record> missed_;  ///< the first wait that ended early
};

}  // namespace lowbit::comm
