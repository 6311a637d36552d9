// split_by_node for NCCL: the node-local and cross-node (rail) communicators of a job,
// made with ncclCommSplit.
#pragma once

#include <nccl.h>
#include <unistd.h>

#include <climits>
#include <string>

#include "lowbit/comm/nccl_comm.hpp"
#include "lowbit/comm/node_comms.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/nccl_try.hpp"

namespace lowbit::comm {

namespace detail {
/// An owned ncclCommSplit of `parent` (colour, key).
inline nccl_comm nccl_split_owned(const nccl_comm& parent, int color, int key) {
  ncclComm_t c = nullptr;
  LOWBIT_NCCL_TRY(ncclCommSplit(parent.get(), color, key, &c, nullptr));
  return nccl_comm(c, ownership::owned);
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

/// Cuts `world` into node-local and rail communicators (two ncclCommSplit calls, so
/// collective over `world`), taking ranks with the same `node_key` (any int >= 0: a
/// launcher's GROUP_RANK, say) as one node; they need not be contiguous in `world`.
/// Throws lowbit::invalid_argument where this rank can see that the nodes differ in size
/// (node size times rail size is not the world size; a rank of the smallest node always
/// sees it, and a hierarchical collective's constructor then fails on every rank).
inline node_comms<nccl_comm> split_by_node(const nccl_comm& world, int node_key) {
  world.check("lowbit::comm::split_by_node");
  LOWBIT_EXPECTS(node_key >= 0, "lowbit::comm::split_by_node: the node key must be >= 0, got " +
                                    std::to_string(node_key));
  node_comms<nccl_comm> nc;
  nc.intra = detail::nccl_split_owned(world, node_key, world.rank());
  nc.local_rank = nc.intra.rank();
  nc.ranks_per_node = nc.intra.size();
  nc.inter = detail::nccl_split_owned(world, nc.local_rank, world.rank());
  nc.node = nc.inter.rank();
  nc.nodes = nc.inter.size();
  LOWBIT_EXPECTS(nc.nodes * nc.ranks_per_node == world.size(),
                 "lowbit::comm::split_by_node: this rank's node holds " +
                     std::to_string(nc.ranks_per_node) + " ranks and its rail " +
                     std::to_string(nc.nodes) + ", but the job has " +
                     std::to_string(world.size()) +
                     ": hierarchical collectives need the same number of ranks on every node");
  return nc;
}

/// The same with the host's name as the node (hashed: two hosts whose names hash alike
/// would be taken as one node, which the size check then most likely refuses).
inline node_comms<nccl_comm> split_by_node(const nccl_comm& world) {
  return split_by_node(world, detail::host_color());
}

}  // namespace lowbit::comm
