// transport-probe: how fast the same bytes per rank move between GPUs, four ways, under
// the link regime the environment selects (NCCL_P2P_DISABLE, NCCL_SHM_DISABLE):
//   sendrecv   grouped ncclSend/ncclRecv (an all-to-all of frames);
//   allgather  in-place ncclAllGather on cudaMalloc memory (what lowbit issues now);
//   sym_ag     the same ncclAllGather on ncclMemAlloc memory registered as a symmetric
//              window (NCCL may then pick its symmetric-memory kernels);
//   lsa_push   a kernel that stores this rank's slot into every load/store-accessible
//              peer's window (NCCL's device API), then a release/acquire LSA barrier.
// Not installed: it explains lowbit-perf's figures and chooses transports.
//
//   mpirun -np 2 transport-probe [min_bytes max_bytes [ctas]]   (bytes sent to each peer)
#include <mpi.h>

#include <nccl_device.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <lowbit/comm/mpi_bootstrap.hpp>

#include "lowbit_perf/timing.hpp"

namespace {

// Copies this rank's slot [lsaRank*bytes, +bytes) of the window to the same slot of
// every LSA peer with 16-byte stores, then a barrier so the peers' data has landed
// (release/acquire) before the kernel ends on either side.
__global__ void lsa_push(ncclWindow_t win, std::size_t bytes, ncclDevComm dev) {
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), dev, ncclTeamLsa(dev), dev.lsaBarrier,
                                         blockIdx.x};
  bar.sync(ncclCoopCta(), cuda::memory_order_relaxed);  // peers done reading last round
  const std::size_t base = std::size_t(dev.lsaRank) * bytes;
  const auto* src = static_cast<const uint4*>(ncclGetLsaPointer(win, base, dev.lsaRank));
  const std::size_t n = bytes / sizeof(uint4);
  for (int k = 1; k < dev.lsaSize; ++k) {
    const int peer = (dev.lsaRank + k) % dev.lsaSize;
    auto* dst = static_cast<uint4*>(ncclGetLsaPointer(win, base, peer));
    for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
         i += std::size_t(gridDim.x) * blockDim.x)
      dst[i] = src[i];
  }
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

}  // namespace

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
    const int ctas = argc > 3 ? std::atoi(argv[3]) : 64;
    char *send, *recv, *sym;
    LOWBIT_CUDA_TRY(cudaMalloc(&send, hi * P));
    LOWBIT_CUDA_TRY(cudaMalloc(&recv, hi * P));
    ncclComm_t c = comm.get();
    LOWBIT_NCCL_TRY(ncclMemAlloc(reinterpret_cast<void**>(&sym), hi * P));
    ncclWindow_t win;
    LOWBIT_NCCL_TRY(ncclCommWindowRegister(c, sym, hi * P, &win, NCCL_WIN_COLL_SYMMETRIC));
    ncclDevCommRequirements reqs{};
    reqs.lsaBarrierCount = ctas;
    ncclDevComm dev{};
    LOWBIT_NCCL_TRY(ncclDevCommCreate(c, &reqs, &dev));
    cudaStream_t s;
    LOWBIT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (rank == 0)
      std::printf(
          "# transport-probe, %d ranks, lsaSize %d, %d CTAs for lsa_push; bytes = sent to each "
          "peer; GB/s = bytes*(P-1)/t\n#%11s %12s %7s %12s %7s %12s %7s %12s %7s\n",
          P, dev.lsaSize, ctas, "bytes", "sendrecv_us", "GB/s", "allgather_us", "GB/s", "sym_ag_us",
          "GB/s", "lsa_push_us", "GB/s");
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
      const auto push = [&](cudaStream_t st) {
        lsa_push<<<ctas, 512, 0, st>>>(win, b, dev);
        LOWBIT_CUDA_TRY(cudaGetLastError());
      };
      const int iters = b >= (64u << 20) ? 10 : 20;
      const double t1 = lowbit_perf::time_median_us(sendrecv, s, 3, iters);
      const double t2 = lowbit_perf::time_median_us(allgather, s, 3, iters);
      const double t3 = lowbit_perf::time_median_us(sym_allgather, s, 3, iters);
      const double t4 = dev.lsaSize == P ? lowbit_perf::time_median_us(push, s, 3, iters) : 0.0;
      const double moved = double(b) * (P - 1);
      const auto rate = [&](double t) { return t > 0 ? moved / t / 1e3 : 0.0; };
      if (rank == 0)
        std::printf(" %11zu %12.1f %7.1f %12.1f %7.1f %12.1f %7.1f %12.1f %7.1f\n", b, t1, rate(t1),
                    t2, rate(t2), t3, rate(t3), t4, rate(t4));
    }
    comm.sync(s);
    LOWBIT_NCCL_TRY(ncclDevCommDestroy(c, &dev));
    LOWBIT_NCCL_TRY(ncclCommWindowDeregister(c, win));
    LOWBIT_NCCL_TRY(ncclMemFree(sym));
    cudaFree(send);
    cudaFree(recv);
    cudaStreamDestroy(s);
  }
  MPI_Finalize();
  return 0;
}
