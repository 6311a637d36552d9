// lowbit-perf's timing, shared with transport-probe: CUDA events around back-to-back
// calls after a warm-up, the median, and the slowest rank's median as the result.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <vector>

#include <cuda_runtime_api.h>

#include <lowbit/core/error.hpp>

namespace lowbit_perf {

/// Times `fn(stream)` with CUDA events: warm-up, then the median of `iters` runs (us).
template <class Fn>
double time_median_us(Fn&& fn, cudaStream_t stream, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn(stream);
  std::vector<cudaEvent_t> ev(iters + 1);
  for (auto& e : ev) LOWBIT_CUDA_TRY(cudaEventCreate(&e));
  MPI_Barrier(MPI_COMM_WORLD);
  LOWBIT_CUDA_TRY(cudaEventRecord(ev[0], stream));
  for (int i = 0; i < iters; ++i) {
    fn(stream);
    LOWBIT_CUDA_TRY(cudaEventRecord(ev[i + 1], stream));
  }
  LOWBIT_CUDA_TRY(cudaEventSynchronize(ev[iters]));
  std::vector<float> t(iters);
  for (int i = 0; i < iters; ++i) LOWBIT_CUDA_TRY(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
  for (auto& e : ev) cudaEventDestroy(e);
  std::nth_element(t.begin(), t.begin() + iters / 2, t.end());
  double us = t[iters / 2] * 1e3;
  // The slowest rank's median is the collective's time.
  MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return us;
}

}  // namespace lowbit_perf
