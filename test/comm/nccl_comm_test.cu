// The NCCL communicator wrapper and the MPI bootstrap (2 GPUs, one MPI rank each).
#define CATCH_CONFIG_RUNNER
#include <mpi.h>
#include <catch2/catch.hpp>

#include <utility>

#include "lowbit/collective/nccl.cuh"
#include "lowbit/comm/mpi_bootstrap.hpp"
#include "lowbit/transport/nccl/copy_engines.cuh"

// No `using namespace lowbit` at file scope: nvcc's stub code calls ::round, which
// lowbit::round would make ambiguous.
namespace lowbit::test {

TEST_CASE("nccl_comm: rank and size come from NCCL; borrowed handles survive the wrapper") {
  comm::nccl_comm owned = comm::nccl_comm_from_mpi(MPI_COMM_WORLD);
  int r = 0, s = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  CHECK(owned.rank() == r);
  CHECK(owned.size() == s);
  CHECK(owned.owns());
  CHECK(owned.valid());
  {
    comm::nccl_comm borrowed(owned.get());
    CHECK_FALSE(borrowed.owns());
    CHECK(borrowed.rank() == r);
  }  // does not destroy the handle
  CHECK(owned.async_error() == ncclSuccess);
  cudaStream_t st;
  LOWBIT_CUDA_TRY(cudaStreamCreate(&st));
  float* d = nullptr;
  LOWBIT_CUDA_TRY(cudaMalloc(&d, 1024 * sizeof(float)));
  LOWBIT_NCCL_TRY(ncclAllReduce(d, d, 1024, ncclFloat, ncclSum, owned.get(), st));
  CHECK_NOTHROW(owned.sync(st));
  comm::nccl_comm moved(std::move(owned));
  CHECK_FALSE(owned.valid());
  CHECK(moved.valid());
  cudaFree(d);
  cudaStreamDestroy(st);
}

TEST_CASE("nccl_comm: one copy-engine split, carried by moves, aborted with the communicator") {
  using lowbit::transport::copy_engines_comm;
  comm::nccl_comm c = comm::nccl_comm_from_mpi(MPI_COMM_WORLD);
  const ncclComm_t split = copy_engines_comm(c);  // collective: every rank makes it
  CHECK((split != nullptr) == (LOWBIT_HAS_NCCL_ZERO_CTA != 0));
  CHECK(copy_engines_comm(c) == split);
  comm::nccl_comm moved(std::move(c));
  CHECK(copy_engines_comm(moved) == split);
  CHECK_THROWS_AS(copy_engines_comm(c), lowbit::invalid_argument);
  moved.abort();  // the split, then the parent; the destructor frees neither again
  CHECK_THROWS_AS(copy_engines_comm(moved), lowbit::invalid_argument);
}

TEST_CASE("an empty or aborted communicator is refused before any byte is sent") {
  using C = codec<quant::absmax<4>>;
  comm::nccl_comm empty;
  CHECK(empty.size() == 0);
  CHECK_THROWS_AS((all_reduce<float, C>(empty, 100)), lowbit::invalid_argument);

  comm::nccl_comm c = comm::nccl_comm_from_mpi(MPI_COMM_WORLD);
  all_reduce<float, C> reduce(c, 1000);
  c.abort();
  CHECK(c.aborted());
  float* d = nullptr;
  LOWBIT_CUDA_TRY(cudaMalloc(&d, 1000 * sizeof(float)));
  CHECK_THROWS_AS(reduce(d, d, 1000, nullptr), lowbit::invalid_argument);
  CHECK_THROWS_WITH(reduce(d, d, 1000, nullptr), Catch::Contains("aborted"));
  CHECK_THROWS_AS((all_reduce<float, C>(c, 100)), lowbit::invalid_argument);
  cudaFree(d);
}

}  // namespace lowbit::test

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  lowbit::comm::select_local_device(MPI_COMM_WORLD);
  int rc = Catch::Session().run(argc, argv), worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
