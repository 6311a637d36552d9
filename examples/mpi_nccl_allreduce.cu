// A low-bit all-reduce across GPUs: MPI bootstraps NCCL, lowbit reduces a device buffer
// at the chosen width, and the program prints the error against the exact sum and the
// time against ncclAllReduce on the same fp32 buffer (nccl-tests' algbw / busbw).
//
//   mpirun -np 2 ./mpi_nccl_allreduce --bits 4 --count 16777216
#include <mpi.h>

#include <cstdio>
#include <vector>

#include "example_args.hpp"
#include "lowbit/collective/nccl.cuh"
#include "lowbit/comm/mpi_bootstrap.hpp"

template <int Bits>
using codec = lowbit::codec<lowbit::quant::absmax<Bits, 128>, lowbit::round::stochastic>;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    const example::args a = example::parse(argc, argv);
    int rank = 0, P = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    const int dev = lowbit::comm::select_local_device(MPI_COMM_WORLD);
    lowbit::comm::nccl_comm comm = lowbit::comm::nccl_comm_from_mpi(MPI_COMM_WORLD);
    cudaStream_t stream;
    LOWBIT_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    lowbit::collective_options opts;
    opts.seed = a.seed;
    opts.op = a.avg ? lowbit::reduce_op::avg : lowbit::reduce_op::sum;
    opts.verify = a.verify;
    auto run = [&](auto& reduce, const char* schedule) {
      const auto in = example::input(a.count, rank, a.seed);
      std::vector<float> out(a.count);
      float *d_in = nullptr, *d_out = nullptr;
      LOWBIT_CUDA_TRY(cudaMalloc(&d_in, a.count * sizeof(float)));
      LOWBIT_CUDA_TRY(cudaMalloc(&d_out, a.count * sizeof(float)));
      LOWBIT_CUDA_TRY(cudaMemcpy(d_in, in.data(), a.count * sizeof(float), cudaMemcpyHostToDevice));

      reduce.async(d_in, d_out, a.count, a.bits, stream);
      comm.sync(stream);
      LOWBIT_CUDA_TRY(
          cudaMemcpy(out.data(), d_out, a.count * sizeof(float), cudaMemcpyDeviceToHost));
      example::report_error(in, out, a.avg);

      cudaEvent_t e0, e1;
      LOWBIT_CUDA_TRY(cudaEventCreate(&e0));
      LOWBIT_CUDA_TRY(cudaEventCreate(&e1));
      auto time = [&](auto&& call) {
        for (int i = 0; i < 3; ++i) call();  // warm-up
        comm.sync(stream);
        MPI_Barrier(MPI_COMM_WORLD);
        LOWBIT_CUDA_TRY(cudaEventRecord(e0, stream));
        for (int i = 0; i < a.iters; ++i) call();
        LOWBIT_CUDA_TRY(cudaEventRecord(e1, stream));
        comm.sync(stream);
        float ms = 0;
        LOWBIT_CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
        double t = ms / a.iters;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        return t;
      };
      const double t_lowbit = time([&] { reduce.async(d_in, d_out, a.count, a.bits, stream); });
      const double t_nccl = time([&] {
        LOWBIT_NCCL_TRY(
            ncclAllReduce(d_in, d_out, a.count, ncclFloat, ncclSum, comm.get(), stream));
      });
      if (rank == 0) {
        const double bytes = 4.0 * a.count, bus = 2.0 * (P - 1) / P;
        std::printf("ranks %d (GPU %d on rank 0), count %zu floats (%.1f MiB), %d bits, %s\n", P,
                    dev, a.count, bytes / (1 << 20), a.bits, schedule);
        std::printf("%-22s %10s %12s %12s\n", "", "time(ms)", "algbw(GB/s)", "busbw(GB/s)");
        std::printf("%-22s %10.3f %12.2f %12.2f\n", "lowbit all_reduce", t_lowbit,
                    bytes / t_lowbit / 1e6, bytes / t_lowbit / 1e6 * bus);
        std::printf("%-22s %10.3f %12.2f %12.2f\n", "ncclAllReduce fp32", t_nccl,
                    bytes / t_nccl / 1e6, bytes / t_nccl / 1e6 * bus);
        std::printf("speed-up over NCCL: %.2fx; frame bytes %.1f%% of fp32\n", t_nccl / t_lowbit,
                    100.0 * example::frame_bytes<codec>(a.bits, a.count) / bytes);
      }
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      cudaFree(d_in);
      cudaFree(d_out);
    };
    using widths = lowbit::bit_widths<1, 2, 4, 8>;
    if (a.flat) {
      lowbit::dynamic_all_reduce<float, codec, widths, lowbit::feedback::none,
                                 lowbit::schedule::flat>
          reduce(comm, a.count, opts);
      run(reduce, "flat");
    } else {
      lowbit::dynamic_all_reduce<float, codec, widths, lowbit::feedback::none,
                                 lowbit::schedule::pipelined<4>>
          reduce(comm, a.count, opts);
      run(reduce, "pipelined<4>");
    }
    cudaStreamDestroy(stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_nccl_allreduce: %s\n", e.what());
    rc = 1;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
