// A node_comm bootstrapped over MPI (for MPI programs and the tests): the ranks of an MPI
// communicator, which must all be on one node, exchange what node_comm needs with
// MPI_Allgather on that communicator.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstddef>

#include "lowbit/comm/mpi_comm.hpp"
#include "lowbit/comm/node_comm.hpp"
#include "lowbit/core/error.hpp"

namespace lowbit::comm {

/// The ranks of `comm` as a node_comm, on the current device (collective over `comm`).
/// `comm` is borrowed: it must stay valid while collectives are built on the result.
inline node_comm node_comm_from_mpi(MPI_Comm comm) {
  int rank = 0, size = 0;
  LOWBIT_MPI_TRY(MPI_Comm_rank(comm, &rank));
  LOWBIT_MPI_TRY(MPI_Comm_size(comm, &size));
  return node_comm(rank, size, [comm](const void* mine, void* all, std::size_t bytes) {
    LOWBIT_EXPECTS(bytes <= INT_MAX, "node_comm_from_mpi: bootstrap message too large");
    const int n = static_cast<int>(bytes);
    LOWBIT_MPI_TRY(MPI_Allgather(mine, n, MPI_BYTE, all, n, MPI_BYTE, comm));
  });
}

}  // namespace lowbit::comm
