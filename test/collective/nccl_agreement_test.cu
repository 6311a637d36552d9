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
#include "mpi_test_main.hpp"

int main(int argc, char** argv) {
  return lowbit::test::mpi_test_main(
      argc, argv,
      [] { LOWBIT_CUDA_TRY(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking)); },
      [] { cudaStreamDestroy(g_stream); });
}
