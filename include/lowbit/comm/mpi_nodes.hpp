// split_by_node for MPI: the node-local and cross-node (rail) communicators of a job.
#pragma once

#include <mpi.h>

#include <string>
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
}  // namespace detail

/// Cuts `world` into node-local and rail communicators, taking ranks with the same
/// `node_key` as one node (any int; the nodes are numbered by their lowest parent rank).
/// Collective over `world`. An explicit key lets a job choose its nodes (a launcher's
/// GROUP_RANK, say) and lets tests build node shapes on one host; ranks of one node
/// need not be contiguous in `world`. Throws lowbit::invalid_argument, on every rank,
/// unless every node has the same number of ranks.
inline node_comms<mpi_comm> split_by_node(const mpi_comm& world, int node_key) {
  world.check("lowbit::comm::split_by_node");
  node_comms<mpi_comm> nc;
  MPI_Comm w = world.get();
  const int me = world.rank();
  // The key may be negative or huge, and MPI colours must be >= 0: a node's colour is
  // its lowest parent rank.
  std::vector<int> keys(static_cast<std::size_t>(world.size()));
  LOWBIT_MPI_TRY(MPI_Allgather(&node_key, 1, MPI_INT, keys.data(), 1, MPI_INT, w));
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
inline node_comms<mpi_comm> split_by_node(const mpi_comm& world) {
  world.check("lowbit::comm::split_by_node");
  MPI_Comm shared = MPI_COMM_NULL;
  LOWBIT_MPI_TRY(
      MPI_Comm_split_type(world.get(), MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL, &shared));
  // The node's key: the world rank of its first member.
  int first = world.rank();
  LOWBIT_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, shared));
  MPI_Comm_free(&shared);
  return split_by_node(world, first);
}

}  // namespace lowbit::comm
