// transport-probe: how fast NCCL moves the same bytes per rank as a grouped
// ncclSend/ncclRecv exchange (what lowbit's all-to-all of frames issues) and as an
// in-place ncclAllGather, under the link regime the environment selects
// (NCCL_P2P_DISABLE, NCCL_SHM_DISABLE). Not installed: it explains lowbit-perf's figures.
//
//   mpirun -np 2 transport-probe [min_bytes max_bytes]   (bytes sent to each peer)
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <lowbit/comm/mpi_bootstrap.hpp>

#include "lowbit_perf/timing.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    int rank = 0, P = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    lowbit::comm::select_local_device(MPI_COMM_WORLD);
    auto comm = lowbit::comm::nccl_comm_from_mpi(MPI_COMM_WORLD);
    const std::size_t lo = argc > 2 ? std::strtoull(argv[1], nullptr, 10) : (1u << 20);
    const std::size_t hi = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (256u << 20);
    char *send, *recv;
    LOWBIT_CUDA_TRY(cudaMalloc(&send, hi * P));
    LOWBIT_CUDA_TRY(cudaMalloc(&recv, hi * P));
    cudaStream_t s;
    LOWBIT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    ncclComm_t c = comm.get();
    if (rank == 0)
      std::printf(
          "# transport-probe, %d ranks; bytes = sent to each peer; GB/s = bytes*(P-1)/t\n"
          "#%11s %12s %8s %12s %8s %8s\n",
          P, "bytes", "sendrecv_us", "GB/s", "allgather_us", "GB/s", "ratio");
    for (std::size_t b = lo; b <= hi; b *= 4) {
      const auto sendrecv = [&](cudaStream_t st) {
        LOWBIT_NCCL_TRY(ncclGroupStart());
        for (int p = 0; p < P; ++p) {
          if (p == rank) continue;
          LOWBIT_NCCL_TRY(ncclSend(send + p * b, b, ncclUint8, p, c, st));
          LOWBIT_NCCL_TRY(ncclRecv(recv + p * b, b, ncclUint8, p, c, st));
        }
        LOWBIT_NCCL_TRY(ncclGroupEnd());
      };
      const auto allgather = [&](cudaStream_t st) {
        LOWBIT_NCCL_TRY(ncclAllGather(recv + rank * b, recv, b, ncclUint8, c, st));
      };
      const int iters = b >= (64u << 20) ? 10 : 20;
      const double t1 = lowbit_perf::time_median_us(sendrecv, s, 3, iters);
      const double t2 = lowbit_perf::time_median_us(allgather, s, 3, iters);
      const double moved = double(b) * (P - 1);
      if (rank == 0)
        std::printf(" %11zu %12.1f %8.2f %12.1f %8.2f %8.2f\n", b, t1, moved / t1 / 1e3, t2,
                    moved / t2 / 1e3, t1 / t2);
    }
    comm.sync(s);
    cudaFree(send);
    cudaFree(recv);
    cudaStreamDestroy(s);
  }
  MPI_Finalize();
  return 0;
}
