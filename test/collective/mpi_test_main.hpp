// The main() of a device test whose ranks are MPI processes: MPI_Init, this node-local
// rank's GPU (rank mod GPU count), the test's set-up (communicators, streams), Catch's
// session with the command line, its tear-down, and the worst rank's result as every
// rank's exit code.
#pragma once

#include <mpi.h>
#include <catch2/catch.hpp>

#include "lowbit/comm/mpi_bootstrap.hpp"

namespace lowbit::test {

template <class Setup, class Teardown>
int mpi_test_main(int argc, char** argv, Setup&& setup, Teardown&& teardown) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    lowbit::comm::select_local_device(MPI_COMM_WORLD);
    setup();
    Catch::Session session;
    rc = session.applyCommandLine(argc, argv);
    if (rc == 0) rc = session.run();
    teardown();
  }
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}

}  // namespace lowbit::test
