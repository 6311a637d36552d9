// transport-probe: how fast the same bytes per rank move between GPUs, four ways, under
// the link regime the environment selects (NCCL_P2P_DISABLE, NCCL_SHM_DISABLE):
//   sendrecv   grouped ncclSend/ncclRecv (an all-to-all of frames);
//   allgather  in-place ncclAllGather on cudaMalloc memory (frame_transport::nccl);
//   sym_ag     the same on the backend's symmetric window_buffer (nccl_symmetric);
//   lsa_push   transport::peer_stores: a kernel storing this rank's slot into every
//              load/store-accessible peer's window between LSA barriers (peer_stores);
//   ce_ag      transport::copy_engines: sym_ag over the communicator's zero-CTA split
//              (transport::copy_engines_comm), whose all-gathers run on copy engines within
//              a node (copy_engines).
// Not installed: it explains lowbit-perf's figures and chooses transports.
//
//   mpirun -np 2 transport-probe [min_bytes max_bytes [ctas]]   (bytes sent to each peer)
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <lowbit/comm/mpi_bootstrap.hpp>
#include <lowbit/transport/nccl/copy_engines.cuh>
#include <lowbit/transport/nccl/peer_stores.cuh>
#include <lowbit/transport/nccl/policy.hpp>
#include <lowbit/transport/nccl/window_buffer.cuh>

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
    const int ctas =
        argc > 3 ? std::atoi(argv[3]) : lowbit::transport::default_policy().peer_store_ctas;
    char *send, *recv;
    LOWBIT_CUDA_TRY(cudaMalloc(&send, hi * P));
    LOWBIT_CUDA_TRY(cudaMalloc(&recv, hi * P));
    ncclComm_t c = comm.get();
    // The NCCL backend's own symmetric workspace and peer-store all-gather.
    const lowbit::transport::window_buffer win(c, hi * P, true);
    const lowbit::transport::peer_stores lsa(c, ctas);
    char* sym = reinterpret_cast<char*>(win.data());
    ncclComm_t ce = lowbit::transport::copy_engines_comm(comm);
    const lowbit::transport::window_buffer ce_win(ce != nullptr ? ce : c, hi * P, true);
    char* ce_sym = reinterpret_cast<char*>(ce_win.data());
    cudaStream_t s;
    LOWBIT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (rank == 0)
      std::printf(
          "# transport-probe, %d ranks, peer stores %s, %d CTAs, zero-CTA split %s; bytes = "
          "sent to each peer; GB/s = bytes*(P-1)/t\n#%11s %12s %7s %12s %7s %12s %7s %12s %7s "
          "%12s %7s\n",
          P, lsa.enabled() ? "on" : "off (no load/store access)", ctas,
          ce != nullptr ? "on" : "off (NCCL < 2.28)", "bytes", "sendrecv_us", "GB/s",
          "allgather_us", "GB/s", "sym_ag_us", "GB/s", "lsa_push_us", "GB/s", "ce_ag_us", "GB/s");
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
      const auto sym_allgather = [&](cudaStream_t st) {
        LOWBIT_NCCL_TRY(ncclAllGather(sym + rank * b, sym, b, ncclUint8, c, st));
      };
      const auto push = [&](cudaStream_t st) { lsa.allgather(win, 0, b, st); };
      const auto ce_allgather = [&](cudaStream_t st) {
        LOWBIT_NCCL_TRY(ncclAllGather(ce_sym + rank * b, ce_sym, b, ncclUint8, ce, st));
      };
      const int iters = b >= (64u << 20) ? 10 : 20;
      const double t1 = lowbit_perf::time_median_us(sendrecv, s, 3, iters);
      const double t2 = lowbit_perf::time_median_us(allgather, s, 3, iters);
      const double t3 = lowbit_perf::time_median_us(sym_allgather, s, 3, iters);
      const double t4 = lsa.enabled() ? lowbit_perf::time_median_us(push, s, 3, iters) : 0.0;
      const double t5 =
          ce != nullptr ? lowbit_perf::time_median_us(ce_allgather, s, 3, iters) : 0.0;
      const double moved = double(b) * (P - 1);
      const auto rate = [&](double t) { return t > 0 ? moved / t / 1e3 : 0.0; };
      if (rank == 0)
        std::printf(" %11zu %12.1f %7.1f %12.1f %7.1f %12.1f %7.1f %12.1f %7.1f %12.1f %7.1f\n", b,
                    t1, rate(t1), t2, rate(t2), t3, rate(t3), t4, rate(t4), t5, rate(t5));
    }
    comm.sync(s);
    cudaFree(send);
    cudaFree(recv);
    cudaStreamDestroy(s);
  }
  MPI_Finalize();
  return 0;
}
