// split_by_node for NCCL: the node-local and cross-node (rail) communicators of a job,
// made with ncclCommSplit.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lowbit/comm/nccl_comm.hpp"
#include "lowbit/comm/node_comms.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/nccl_try.hpp"

namespace lowbit::comm {

namespace detail {
/// An owned ncclCommSplit of `parent` (colour, key). A null config makes the child inherit
/// the parent's: split_by_node has checked that the parent is blocking, and this refuses a
/// split that ran in the background all the same (ncclInProgress: a non-blocking parent),
/// once it has finished (NCCL writes the handle when it does), within `timeout`.
inline nccl_comm nccl_split_owned(const nccl_comm& parent, int color, int key,
                                  std::chrono::milliseconds timeout) {
  auto slot = std::make_unique<ncclComm_t>(nullptr);
  const ncclResult_t r = ncclCommSplit(parent.get(), color, key, slot.get(), nullptr);
  if (r == ncclInProgress) {
    const auto start = std::chrono::steady_clock::now();
    while (parent.async_error() == ncclInProgress) {
      if (timeout.count() > 0 && std::chrono::steady_clock::now() - start > timeout) {
        slot.release();  // NCCL may still write it: left to it
        throw timeout_error(__FILE__, __LINE__,
                            "lowbit::comm::split_by_node: a background ncclCommSplit did not "
                            "finish within " +
                                std::to_string(timeout.count()) + " ms");
      }
      std::this_thread::yield();
    }
    if (*slot != nullptr) ncclCommAbort(*slot);
    throw invalid_argument(__FILE__, __LINE__,
                           "lowbit::comm::split_by_node: ncclCommSplit ran in the background "
                           "(ncclInProgress): the parent communicator is non-blocking "
                           "(ncclConfig_t::blocking = 0), which lowbit's collectives do not "
                           "support; the split is aborted");
  }
  LOWBIT_NCCL_TRY(r);
  return nccl_comm(*slot, ownership::owned);
}

/// Every rank's `n` ints at `mine`, rank by rank, all-gathered over `world` within
/// `timeout` (on expiry `world` is aborted and lowbit::timeout_error thrown). `ran_async`
/// is set when ncclGroupEnd returned ncclInProgress: `world` is non-blocking, and the
/// gather was waited for in the background before its stream.
inline std::vector<int> nccl_allgather_ints(const nccl_comm& world, const int* mine, std::size_t n,
                                            std::chrono::milliseconds timeout, bool& ran_async) {
  struct scratch {  // freed on every path
    int* dev = nullptr;
    cudaStream_t stream = nullptr;
    ~scratch() {
      if (stream != nullptr) cudaStreamDestroy(stream);
      if (dev != nullptr) cudaFree(dev);
    }
  } sc;
  const std::size_t P = static_cast<std::size_t>(world.size());
  const std::size_t me = static_cast<std::size_t>(world.rank());
  LOWBIT_CUDA_TRY(cudaMalloc(&sc.dev, n * P * sizeof(int)));
  LOWBIT_CUDA_TRY(cudaStreamCreateWithFlags(&sc.stream, cudaStreamNonBlocking));
  LOWBIT_CUDA_TRY(
      cudaMemcpyAsync(sc.dev + me * n, mine, n * sizeof(int), cudaMemcpyHostToDevice, sc.stream));
  LOWBIT_NCCL_TRY(ncclGroupStart());
  LOWBIT_NCCL_TRY(ncclAllGather(sc.dev + me * n, sc.dev, n, ncclInt32, world.get(), sc.stream));
  const ncclResult_t r = ncclGroupEnd();
  LOWBIT_NCCL_TRY(r);
  if (r == ncclInProgress) ran_async = true;
  const auto timed_out = [&](const char* what) {
    world.abort();
    return timeout_error(__FILE__, __LINE__,
                         std::string("lowbit::comm::split_by_node: timed out after ") +
                             std::to_string(timeout.count()) + " ms waiting for " + what +
                             " (a rank that never called?); the communicator is aborted");
  };
  const auto start = std::chrono::steady_clock::now();
  while (world.async_error() == ncclInProgress) {  // a non-blocking world enqueues late
    if (timeout.count() > 0 && std::chrono::steady_clock::now() - start > timeout)
      throw timed_out("the non-blocking communicator to enqueue the node keys' all-gather");
    std::this_thread::yield();
  }
  try {
    world.sync(sc.stream, timeout);
  } catch (const timeout_error&) {
    throw timed_out("every rank's node key");
  }
  std::vector<int> all(n * P);
  LOWBIT_CUDA_TRY(cudaMemcpy(all.data(), sc.dev, all.size() * sizeof(int), cudaMemcpyDeviceToHost));
  return all;
}

/// Why the node keys of every rank (keys[p]: rank p's), and whether each rank's world is
/// non-blocking, make no hierarchical shape; empty when they do. A function of the
/// gathered values alone, so every rank reaches the same verdict.
inline std::string node_shape_error(const std::vector<int>& keys, const std::vector<int>& async) {
  std::string ranks;
  for (std::size_t p = 0; p < async.size(); ++p)
    if (async[p]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(p);
  if (!ranks.empty())
    return "the communicator is non-blocking (ncclConfig_t::blocking = 0) on rank(s) " + ranks +
           ": ncclCommSplit would make non-blocking node communicators, which lowbit's "
           "collectives do not support; split a blocking communicator";
  for (std::size_t p = 0; p < keys.size(); ++p)
    if (keys[p] < 0)
      return "rank " + std::to_string(p) + "'s node key is " + std::to_string(keys[p]) +
             ": keys must be >= 0";
  std::map<int, int> sizes;
  for (const int k : keys) ++sizes[k];
  int lo = INT_MAX, hi = 0, lo_key = 0, hi_key = 0;
  for (const auto& [k, n] : sizes) {
    if (n < lo) lo = n, lo_key = k;
    if (n > hi) hi = n, hi_key = k;
  }
  if (lo != hi)
    return "nodes hold between " + std::to_string(lo) + " ranks (node key " +
           std::to_string(lo_key) + ") and " + std::to_string(hi) + " (node key " +
           std::to_string(hi_key) +
           "): hierarchical collectives need the same number of ranks on every node";
  return {};
}

/// This host's name hashed to an ncclCommSplit colour (>= 0).
inline int host_color() {
  char name[256] = {};
  LOWBIT_EXPECTS(gethostname(name, sizeof name - 1) == 0,
                 "lowbit::comm::split_by_node: gethostname failed");
  unsigned h = 2166136261u;  // FNV-1a
  for (const char* p = name; *p != '\0'; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 16777619u;
  return static_cast<int>(h & 0x7fffffffu);
}
}  // namespace detail

/// Cuts `world` into node-local and rail communicators, taking ranks with the same
/// `node_key` (any int >= 0: a launcher's GROUP_RANK, say) as one node; they need not be
/// contiguous in `world`. Collective over `world`: every rank's key is first all-gathered
/// over it (within `timeout`; on expiry `world` is aborted and lowbit::timeout_error
/// thrown), and every rank judges the same keys, so either every rank throws the same
/// lowbit::invalid_argument, before any split, or every rank makes the two ncclCommSplit
/// calls. Refused: a negative key, nodes of different sizes, and a non-blocking `world`
/// (ncclCommSplit with no config would make non-blocking children, which lowbit's
/// collectives do not support).
inline node_comms<nccl_comm> split_by_node(
    const nccl_comm& world, int node_key,
    std::chrono::milliseconds timeout = std::chrono::minutes(10)) {
  world.check("lowbit::comm::split_by_node");
  const int me = world.rank();
  bool ran_async = false;
  const std::vector<int> keys =
      detail::nccl_allgather_ints(world, &node_key, 1, timeout, ran_async);
  // Whether a rank's gather ran in the background is known only after it: a second round
  // shares it, so that every rank refuses a world that is non-blocking on any rank.
  const int mine = ran_async ? 1 : 0;
  const std::vector<int> async = detail::nccl_allgather_ints(world, &mine, 1, timeout, ran_async);
  const std::string why = detail::node_shape_error(keys, async);
  LOWBIT_EXPECTS(why.empty(), "lowbit::comm::split_by_node: " + why +
                                  " (every rank raises this; nothing was split)");
  node_comms<nccl_comm> nc;
  nc.intra = detail::nccl_split_owned(world, node_key, me, timeout);
  nc.local_rank = nc.intra.rank();
  nc.ranks_per_node = nc.intra.size();
  nc.inter = detail::nccl_split_owned(world, nc.local_rank, me, timeout);
  nc.node = nc.inter.rank();
  nc.nodes = nc.inter.size();
  LOWBIT_EXPECTS(nc.nodes * nc.ranks_per_node == world.size(),
                 "lowbit::comm::split_by_node: this rank's node holds " +
                     std::to_string(nc.ranks_per_node) + " ranks and its rail " +
                     std::to_string(nc.nodes) + ", but the job has " +
                     std::to_string(world.size()) + " (a lowbit bug: the keys were checked)");
  return nc;
}

/// The same with the host's name as the node (hashed: two hosts whose names hash alike
/// would be taken as one node, which the size check then most likely refuses).
inline node_comms<nccl_comm> split_by_node(
    const nccl_comm& world, std::chrono::milliseconds timeout = std::chrono::minutes(10)) {
  return split_by_node(world, detail::host_color(), timeout);
}

}  // namespace lowbit::comm
