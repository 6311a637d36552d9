// The MPI communicator wrapper.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>
#include <catch2/catch.hpp>

#include <utility>

#include "lowbit/comm/mpi_comm.hpp"

using lowbit::comm::mpi_comm;

TEST_CASE("mpi_comm borrows MPI_COMM_WORLD and reports its rank and size") {
  mpi_comm c(MPI_COMM_WORLD);
  int r = -1, s = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  CHECK(c.rank() == r);
  CHECK(c.size() == s);
  CHECK(c.valid());
  CHECK_FALSE(c.owns());
  CHECK(c.get() == MPI_COMM_WORLD);
  CHECK_NOTHROW(c.barrier());
}

TEST_CASE("an empty or moved-from mpi_comm is refused") {
  mpi_comm empty;
  CHECK(empty.size() == 0);
  CHECK_FALSE(empty.valid());
  CHECK_THROWS_AS(empty.check("test"), lowbit::invalid_argument);
  CHECK_THROWS_AS(mpi_comm(MPI_COMM_NULL), lowbit::invalid_argument);
  mpi_comm a = mpi_comm::duplicate(MPI_COMM_WORLD);
  CHECK(a.owns());
  mpi_comm b(std::move(a));
  CHECK_FALSE(a.valid());
  CHECK(b.valid());
  CHECK(b.owns());
  CHECK_NOTHROW(b.barrier());
}

TEST_CASE("LOWBIT_MPI_TRY turns an MPI error into lowbit::mpi_error") {
  mpi_comm c = mpi_comm::duplicate(MPI_COMM_WORLD);  // MPI_ERRORS_RETURN
  int x = 0;
  // A negative count is an error MPI reports without communicating.
  auto bad = [&] { LOWBIT_MPI_TRY(MPI_Bcast(&x, -1, MPI_INT, 0, c.get())); };
  CHECK_THROWS_AS(bad(), lowbit::mpi_error);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = Catch::Session().run(argc, argv), worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
