// async() enqueues on a CUDA stream: the MPI backend, whose calls complete before they
// return, has none, and says so.
#include <lowbit/collective/mpi.hpp>
using C = lowbit::codec<lowbit::quant::absmax<4>, lowbit::round::stochastic>;
int main() {
  lowbit::comm::mpi_comm comm(MPI_COMM_WORLD);
  lowbit::mpi::all_reduce<float, C> reduce(comm, 1024);
  float x[4] = {};
  reduce.async(x, x, 4, {});
  return 0;
}
