// The agreement cases (device_agreement_cases.cuh) on the NCCL backend (2+ GPUs, one MPI
// rank each).
#define CATCH_CONFIG_RUNNER
#include <mpi.h>
#include <catch2/catch.hpp>

#include "lowbit/collective/nccl.cuh"
#include "lowbit/comm/mpi_bootstrap.hpp"

namespace {
using backend = lowbit::backend::nccl;
cudaStream_t g_stream = nullptr;
lowbit::comm::nccl_comm fresh_comm() { return lowbit::comm::nccl_comm_from_mpi(MPI_COMM_WORLD); }
}  // namespace

#include "device_agreement_cases.cuh"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    lowbit::comm::select_local_device(MPI_COMM_WORLD);
    LOWBIT_CUDA_TRY(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    Catch::Session session;
    rc = session.applyCommandLine(argc, argv);
    if (rc == 0) rc = session.run();
    cudaStreamDestroy(g_stream);
  }
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
