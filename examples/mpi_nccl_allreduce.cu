// A low-bit all-reduce across GPUs: MPI bootstraps NCCL, lowbit reduces a device buffer
// at the chosen width, and the program prints the error against the exact sum and the
// time against ncclAllReduce on the same fp32 buffer (nccl-tests' algbw / busbw).
// --backend node runs lowbit on the node backend instead (CUDA IPC between the ranks of
// one node, no NCCL), still beside ncclAllReduce; its ranks may share a GPU, where NCCL
// cannot run: then there is no NCCL figure, and the time is not a speed-up.
//
//   mpirun -np 2 ./mpi_nccl_allreduce --bits 4 --count 16777216
//   mpirun -np 2 ./mpi_nccl_allreduce --bits 4 --count 16777216 --backend node
#include <mpi.h>

#include <cstdio>
#include <optional>
#include <vector>

#include "example_args.hpp"
#include "lowbit/collective/nccl.cuh"
#include "lowbit/collective/node.cuh"
#include "lowbit/comm/mpi_bootstrap.hpp"
#include "lowbit/comm/node_mpi.hpp"

template <int Bits>
using codec = lowbit::codec<lowbit::quant::absmax<Bits, 128>, lowbit::round::stochastic>;

/// The example on `Backend` over `comm`; `nccl` times the baseline (null: none, as where
/// `shared` ranks share one GPU).
template <class Backend, class Comm>
void run(const example::args& a, const Comm& comm, lowbit::comm::nccl_comm* nccl, int dev,
         int shared) {
  const int rank = comm.rank(), P = comm.size();
  cudaStream_t stream;
  LOWBIT_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  lowbit::collective_options opts;
  opts.seed = a.seed;
  opts.op = a.avg ? lowbit::reduce_op::avg : lowbit::reduce_op::sum;
  opts.verify = a.verify;
  auto measure = [&](auto& reduce, const char* schedule) {
    const auto wait = [&] {  // lowbit's errors, and NCCL's
      reduce.sync(stream);
      if (nccl) nccl->sync(stream);
    };
    const auto in = example::input(a.count, rank, a.seed);
    std::vector<float> out(a.count);
    float *d_in = nullptr, *d_out = nullptr;
    LOWBIT_CUDA_TRY(cudaMalloc(&d_in, a.count * sizeof(float)));
    LOWBIT_CUDA_TRY(cudaMalloc(&d_out, a.count * sizeof(float)));
    LOWBIT_CUDA_TRY(cudaMemcpy(d_in, in.data(), a.count * sizeof(float), cudaMemcpyHostToDevice));

    reduce.async(d_in, d_out, a.count, a.bits, stream);
    wait();
    LOWBIT_CUDA_TRY(cudaMemcpy(out.data(), d_out, a.count * sizeof(float), cudaMemcpyDeviceToHost));
    example::report_error(in, out, a.avg);

    cudaEvent_t e0, e1;
    LOWBIT_CUDA_TRY(cudaEventCreate(&e0));
    LOWBIT_CUDA_TRY(cudaEventCreate(&e1));
    auto time = [&](auto&& call) {
      for (int i = 0; i < 3; ++i) call();  // warm-up
      wait();
      MPI_Barrier(MPI_COMM_WORLD);
      LOWBIT_CUDA_TRY(cudaEventRecord(e0, stream));
      for (int i = 0; i < a.iters; ++i) call();
      LOWBIT_CUDA_TRY(cudaEventRecord(e1, stream));
      wait();
      float ms = 0;
      LOWBIT_CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
      double t = ms / a.iters;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      return t;
    };
    const double t_lowbit = time([&] { reduce.async(d_in, d_out, a.count, a.bits, stream); });
    const double t_nccl = nccl ? time([&] {
      LOWBIT_NCCL_TRY(ncclAllReduce(d_in, d_out, a.count, ncclFloat, ncclSum, nccl->get(), stream));
    })
                               : 0;
    if (rank == 0) {
      const double bytes = 4.0 * a.count, bus = 2.0 * (P - 1) / P;
      std::printf(
          "ranks %d (GPU %d on rank 0), backend %s, count %zu floats (%.1f MiB), %d bits, %s\n", P,
          dev, Backend::name, a.count, bytes / (1 << 20), a.bits, schedule);
      if (shared > 1)
        std::printf(
            "note: %d ranks share one GPU: they time-slice it and share its HBM, so the time "
            "below is not a speed-up\nNCCL baseline unavailable: %d ranks share one GPU\n",
            shared, shared);
      std::printf("%-22s %10s %12s %12s\n", "", "time(ms)", "algbw(GB/s)", "busbw(GB/s)");
      std::printf("%-22s %10.3f %12.2f %12.2f\n", "lowbit all_reduce", t_lowbit,
                  bytes / t_lowbit / 1e6, bytes / t_lowbit / 1e6 * bus);
      if (nccl) {
        std::printf("%-22s %10.3f %12.2f %12.2f\n", "ncclAllReduce fp32", t_nccl,
                    bytes / t_nccl / 1e6, bytes / t_nccl / 1e6 * bus);
        std::printf("speed-up over NCCL: %.2fx; ", t_nccl / t_lowbit);
      }
      std::printf("frame bytes %.1f%% of fp32\n",
                  100.0 * example::frame_bytes<codec>(a.bits, a.count) / bytes);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(d_in);
    cudaFree(d_out);
  };
  using widths = lowbit::bit_widths<1, 2, 4, 8>;
  if (a.flat) {
    lowbit::dynamic_all_reduce<float, codec, widths, lowbit::feedback::none, lowbit::schedule::flat,
                               Backend>
        reduce(comm, a.count, opts);
    measure(reduce, "flat");
  } else {
    lowbit::dynamic_all_reduce<float, codec, widths, lowbit::feedback::none,
                               lowbit::schedule::pipelined<4>, Backend>
        reduce(comm, a.count, opts);
    measure(reduce, "pipelined<4>");
  }
  cudaStreamDestroy(stream);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    const example::args a = example::parse(argc, argv);
    const int dev = lowbit::comm::select_local_device(MPI_COMM_WORLD);
    if (a.backend == "node") {
      const lowbit::comm::node_comm comm = lowbit::comm::node_comm_from_mpi(MPI_COMM_WORLD);
      const int shared = lowbit::comm::ranks_per_gpu(MPI_COMM_WORLD);  // NCCL refuses > 1
      std::optional<lowbit::comm::nccl_comm> nccl;
      if (shared == 1) nccl.emplace(lowbit::comm::nccl_comm_from_mpi(MPI_COMM_WORLD));
      run<lowbit::backend::node>(a, comm, nccl ? &*nccl : nullptr, dev, shared);
    } else {
      lowbit::comm::nccl_comm comm = lowbit::comm::nccl_comm_from_mpi(MPI_COMM_WORLD);
      run<lowbit::backend::nccl>(a, comm, &comm, dev, 1);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_nccl_allreduce: %s\n", e.what());
    rc = 1;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
