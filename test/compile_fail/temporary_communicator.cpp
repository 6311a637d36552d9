// A collective built on a temporary communicator: it would keep a pointer to a dead
// object, so the constructor taking an rvalue communicator is deleted.
#include <lowbit/collective/mpi.hpp>
using C = lowbit::codec<lowbit::quant::absmax<4>, lowbit::round::stochastic>;
int main() {
  lowbit::mpi::all_reduce<float, C> reduce(lowbit::comm::mpi_comm(MPI_COMM_WORLD), 1024);
  return static_cast<int>(reduce.max_count() == 0);
}
