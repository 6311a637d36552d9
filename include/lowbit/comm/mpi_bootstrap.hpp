// Bootstrapping NCCL from MPI (for MPI+NCCL programs and the examples): pick a GPU per
// node-local rank, count the ranks sharing a GPU, broadcast rank 0's ncclUniqueId,
// ncclCommInitRank.
#pragma once

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "lowbit/comm/mpi_comm.hpp"
#include "lowbit/comm/nccl_comm.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/nccl_try.hpp"

namespace lowbit::comm {

/// This process's rank among the ranks of `comm` on the same node.
inline int node_local_rank(MPI_Comm comm) {
  MPI_Comm node = MPI_COMM_NULL;
  LOWBIT_MPI_TRY(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int r = 0;
  MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  return r;
}

/// Makes GPU (node-local rank mod device count) current and returns its index.
inline int select_local_device(MPI_Comm comm) {
  int n = 0;
  LOWBIT_CUDA_TRY(cudaGetDeviceCount(&n));
  LOWBIT_EXPECTS(n > 0, "select_local_device: no CUDA device");
  const int dev = node_local_rank(comm) % n;
  LOWBIT_CUDA_TRY(cudaSetDevice(dev));
  return dev;
}

/// The most ranks of `comm` on one GPU, the same on every rank (GPUs compared by UUID, so
/// whatever CUDA_VISIBLE_DEVICES says): above 1, NCCL refuses the group ("Duplicate GPU
/// detected") and timings of several ranks are not speed-ups. Collective over `comm`.
inline int ranks_per_gpu(MPI_Comm comm) {
  int dev = 0, P = 1;
  LOWBIT_CUDA_TRY(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  LOWBIT_CUDA_TRY(cudaGetDeviceProperties(&prop, dev));
  LOWBIT_MPI_TRY(MPI_Comm_size(comm, &P));
  std::vector<cudaUUID_t> all(static_cast<std::size_t>(P));
  LOWBIT_MPI_TRY(MPI_Allgather(&prop.uuid, sizeof(cudaUUID_t), MPI_BYTE, all.data(),
                               sizeof(cudaUUID_t), MPI_BYTE, comm));
  int most = 1;
  for (const cudaUUID_t& a : all) {
    int same = 0;
    for (const cudaUUID_t& b : all) same += std::memcmp(&a, &b, sizeof a) == 0;
    most = std::max(most, same);
  }
  return most;
}

/// An owned NCCL communicator over the ranks of `comm`, on the current device
/// (collective over `comm`: every rank calls it).
inline nccl_comm nccl_comm_from_mpi(MPI_Comm comm) {
  int rank = 0, size = 0;
  LOWBIT_MPI_TRY(MPI_Comm_rank(comm, &rank));
  LOWBIT_MPI_TRY(MPI_Comm_size(comm, &size));
  ncclUniqueId id{};
  if (rank == 0) LOWBIT_NCCL_TRY(ncclGetUniqueId(&id));
  LOWBIT_MPI_TRY(MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, comm));
  ncclComm_t raw = nullptr;
  LOWBIT_NCCL_TRY(ncclCommInitRank(&raw, size, id, rank));
  return nccl_comm(raw, ownership::owned);
}

}  // namespace lowbit::comm
