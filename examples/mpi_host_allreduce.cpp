// A low-bit all-reduce on the host (MPI) backend: no GPU needed.
//
//   mpirun -np 4 ./mpi_host_allreduce --bits 4 --count 1000000
//
// Every rank all-reduces its buffer at the chosen width (run-time width over the
// compiled set 1, 2, 4, 8), then prints the error against the exact sum and the time
// against MPI_Allreduce on the fp32 buffer.
#include <mpi.h>

#include <cstdio>
#include <vector>

#include "example_args.hpp"
#include "lowbit/collective/mpi.hpp"

template <int Bits>
using codec = lowbit::codec<lowbit::quant::absmax<Bits, 128>, lowbit::round::stochastic>;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    const example::args a = example::parse(argc, argv);
    lowbit::comm::mpi_comm comm(MPI_COMM_WORLD);
    lowbit::collective_options opts;
    opts.seed = a.seed;
    opts.op = a.avg ? lowbit::reduce_op::avg : lowbit::reduce_op::sum;
    opts.verify = a.verify;
    lowbit::mpi::dynamic_all_reduce<float, codec> reduce(comm, a.count, opts);

    const auto in = example::input(a.count, comm.rank(), a.seed);
    std::vector<float> out(a.count), ref(a.count);
    reduce(in.data(), out.data(), a.count, a.bits);  // warm-up, and the result we check
    example::report_error(in, out, a.avg);

    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < a.iters; ++i) reduce(in.data(), out.data(), a.count, a.bits);
    const double t_lowbit = (MPI_Wtime() - t0) / a.iters;
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int i = 0; i < a.iters; ++i)
      MPI_Allreduce(in.data(), ref.data(), static_cast<int>(a.count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    const double t_mpi = (MPI_Wtime() - t0) / a.iters;
    if (comm.rank() == 0) {
      std::printf("ranks %d, count %zu floats, %d bits (host backend)\n", comm.size(), a.count,
                  a.bits);
      std::printf("time per all-reduce: lowbit %.3f ms, MPI_Allreduce fp32 %.3f ms, ratio %.2fx\n",
                  t_lowbit * 1e3, t_mpi * 1e3, t_mpi / t_lowbit);
      std::printf(
          "frame bytes at %d bits: %.1f%% of fp32 (each value crosses the wire twice, "
          "as in a ring all-reduce)\n",
          a.bits, 100.0 * example::frame_bytes<codec>(a.bits, a.count) / (4.0 * a.count));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_host_allreduce: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
