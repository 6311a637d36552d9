// The two communicators a hierarchical collective runs on, as made from one communicator
// by lowbit::comm::split_by_node (comm/mpi_nodes.hpp, comm/nccl_nodes.hpp).
#pragma once

namespace lowbit::comm {

/// A job's communicator cut in two: `intra`, the ranks of this node, and `inter`, this
/// rank's rail (the ranks with the same local index on every node). Both are owned here;
/// a hierarchical collective borrows them, so this object must outlive it. Every node
/// holds the same number of ranks (split_by_node refuses other shapes), so the rails are
/// equal too. Move-only, as the communicators are.
template <class Comm>
struct node_comms {
  Comm intra;              ///< the ranks of this node, ordered by their rank in the parent
  Comm inter;              ///< this rank's rail, ordered by node
  int node = 0;            ///< this rank's node: its rank in `inter`
  int local_rank = 0;      ///< this rank's index on its node: its rank in `intra`
  int nodes = 0;           ///< inter.size()
  int ranks_per_node = 0;  ///< intra.size()
};

}  // namespace lowbit::comm
