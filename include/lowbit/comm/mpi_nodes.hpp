// split_by_node for MPI: the node-local and cross-node (rail) communicators of a job.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lowbit/comm/mpi_comm.hpp"
#include "lowbit/comm/node_comms.hpp"
#include "lowbit/core/error.hpp"

namespace lowbit::comm {

namespace detail {
/// An owned MPI_Comm_split of `parent` (colour, key), errors returned, not aborting.
inline mpi_comm split_owned(MPI_Comm parent, int color, int key) {
  MPI_Comm c = MPI_COMM_NULL;
  LOWBIT_MPI_TRY(MPI_Comm_split(parent, color, key, &c));
  mpi_comm dup = mpi_comm::duplicate(c);  // owned, MPI_ERRORS_RETURN
  MPI_Comm_free(&c);
  return dup;
}

/// Every rank's `mine`, rank by rank (MPI_Iallgather), waiting at most `timeout` (zero: no
/// deadline). On expiry `world` is marked unusable and lowbit::timeout_error names `who`:
/// a rank that never calls cannot hang the others. Once it returns, every rank is in the
/// call, so the blocking collectives after it complete.
inline std::vector<int> allgather_within(const mpi_comm& world, int mine,
                                         std::chrono::milliseconds timeout, const char* who) {
  const std::size_t n = static_cast<std::size_t>(world.size());
  // On the heap: a pending collective that timed out keeps its buffers, for good.
  auto buf = std::make_unique<std::vector<int>>(n + 1);
  (*buf)[n] = mine;
  MPI_Request req = MPI_REQUEST_NULL;
  LOWBIT_MPI_TRY(
      MPI_Iallgather(&(*buf)[n], 1, MPI_INT, buf->data(), 1, MPI_INT, world.get(), &req));
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    int done = 0;
    LOWBIT_MPI_TRY(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return std::vector<int>(buf->begin(), buf->begin() + static_cast<std::ptrdiff_t>(n));
    if (timeout.count() > 0 && std::chrono::steady_clock::now() - start > timeout) {
      static std::vector<std::unique_ptr<std::vector<int>>> abandoned;
      abandoned.push_back(std::move(buf));
      const std::string msg = std::string(who) + ": timed out after " +
                              std::to_string(timeout.count()) +
                              " ms waiting for every rank to call it; the communicator is now "
                              "unusable";
      world.mark_unusable(msg);
      throw timeout_error(__FILE__, __LINE__, msg);
    }
    std::this_thread::yield();
  }
}
}  // namespace detail

/// Cuts `world` into node-local and rail communicators, taking ranks with the same
/// `node_key` as one node (any int; the nodes are numbered by their lowest parent rank).
/// Collective over `world`. An explicit key lets a job choose its nodes (a launcher's
/// GROUP_RANK, say) and lets tests build node shapes on one host; ranks of one node
/// need not be contiguous in `world`. Throws lowbit::invalid_argument, on every rank,
/// unless every node has the same number of ranks; lowbit::timeout_error (and marks
/// `world` unusable) when some rank has not called it within `timeout` (zero: no deadline).
inline node_comms<mpi_comm> split_by_node(
    const mpi_comm& world, int node_key,
    std::chrono::milliseconds timeout = std::chrono::minutes(10)) {
  world.check("lowbit::comm::split_by_node");
  node_comms<mpi_comm> nc;
  MPI_Comm w = world.get();
  const int me = world.rank();
  // The key may be negative or huge, and MPI colours must be >= 0: a node's colour is
  // its lowest parent rank. The gather is the one wait with a deadline: after it every
  // rank is here.
  const std::vector<int> keys =
      detail::allgather_within(world, node_key, timeout, "lowbit::comm::split_by_node");
  int first = me;
  for (int p = 0; p < world.size(); ++p)
    if (keys[static_cast<std::size_t>(p)] == node_key) {
      first = p;
      break;
    }
  nc.intra = detail::split_owned(w, first, me);
  nc.local_rank = nc.intra.rank();
  nc.ranks_per_node = nc.intra.size();
  int lo = 0, hi = 0;
  LOWBIT_MPI_TRY(MPI_Allreduce(&nc.ranks_per_node, &lo, 1, MPI_INT, MPI_MIN, w));
  LOWBIT_MPI_TRY(MPI_Allreduce(&nc.ranks_per_node, &hi, 1, MPI_INT, MPI_MAX, w));
  LOWBIT_EXPECTS(lo == hi, "lowbit::comm::split_by_node: nodes hold between " + std::to_string(lo) +
                               " and " + std::to_string(hi) +
                               " ranks; hierarchical collectives need the same number on "
                               "every node");
  nc.inter = detail::split_owned(w, nc.local_rank, me);
  nc.node = nc.inter.rank();
  nc.nodes = nc.inter.size();
  return nc;
}

/// The same with the nodes MPI sees: ranks that share memory (MPI_COMM_TYPE_SHARED) are
/// one node.
inline node_comms<mpi_comm> split_by_node(
    const mpi_comm& world, std::chrono::milliseconds timeout = std::chrono::minutes(10)) {
  world.check("lowbit::comm::split_by_node");
  // Every rank present before the blocking split below.
  detail::allgather_within(world, world.rank(), timeout, "lowbit::comm::split_by_node");
  MPI_Comm shared = MPI_COMM_NULL;
  LOWBIT_MPI_TRY(
      MPI_Comm_split_type(world.get(), MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL, &shared));
  // The node's key: the world rank of its first member.
  int first = world.rank();
  LOWBIT_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, shared));
  MPI_Comm_free(&shared);
  return split_by_node(world, first, timeout);
}

}  // namespace lowbit::comm
