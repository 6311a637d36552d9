// The agreement cases (device_agreement_cases.cuh) on the node backend: one MPI rank per
// process, rank mod GPU count (several ranks share a GPU on a one-GPU machine).
#define CATCH_CONFIG_RUNNER
#include <mpi.h>
#include <catch2/catch.hpp>

#include "lowbit/collective/node.cuh"
#include "lowbit/comm/mpi_bootstrap.hpp"
#include "lowbit/comm/node_mpi.hpp"

namespace {
using backend = lowbit::backend::node;
cudaStream_t g_stream = nullptr;
lowbit::comm::node_comm fresh_comm() { return lowbit::comm::node_comm_from_mpi(MPI_COMM_WORLD); }
}  // namespace

#include "device_agreement_cases.cuh"
#include "mpi_test_main.hpp"

int main(int argc, char** argv) {
  return lowbit::test::mpi_test_main(
      argc, argv,
      [] { LOWBIT_CUDA_TRY(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking)); },
      [] { cudaStreamDestroy(g_stream); });
}
