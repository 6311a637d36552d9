// The collectives on the host (MPI) backend, on 2, 3 and 4 ranks.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>
#include <catch2/catch.hpp>

#include <vector>

#include "lowbit/collective/mpi.hpp"

namespace lowbit::test {

/// Runs calls straight on host vectors.
struct harness {
  using backend = lowbit::backend::mpi;
  static const comm::mpi_comm& comm() {
    static const comm::mpi_comm c(MPI_COMM_WORLD);
    return c;
  }
  static const comm::mpi_comm& empty_comm() {
    static const comm::mpi_comm c;
    return c;
  }
  template <class C, class T>
  static void call(C& c, const std::vector<T>& in, std::vector<T>& out, std::size_t count) {
    c(in.data(), out.data(), count);
  }
  template <class C, class T>
  static void call_in_place(C& c, std::vector<T>& buf, std::size_t in_off, std::size_t out_off,
                            std::size_t count) {
    c(buf.data() + in_off, buf.data() + out_off, count);
  }
  template <class C>
  static void call_raw(C& c, const typename C::value_type* in, typename C::value_type* out,
                       std::size_t count) {
    c(in, out, count);
  }
  template <class C, class T>
  static void call_typed(C& c, const std::vector<T>& in, std::vector<T>& out, std::size_t count,
                         data_type type) {
    c(static_cast<const void*>(in.data()), static_cast<void*>(out.data()), count, type);
  }
  template <class C, class T>
  static void call_dynamic(C& c, const std::vector<T>& in, std::vector<T>& out, std::size_t count,
                           int bits) {
    c(in.data(), out.data(), count, bits);
  }
};

}  // namespace lowbit::test

#include "collective_cases.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int rank = lowbit::test::world_rank();
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) rc = session.run();
  // Any rank's failure fails the test on every rank.
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && worst != 0) std::fprintf(stderr, "some rank failed (%d)\n", worst);
  MPI_Finalize();
  return worst;
}
