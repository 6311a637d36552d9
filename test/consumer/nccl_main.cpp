// Host code against lowbit::nccl, built against an installed lowbit by scripts/test: the
// NCCL and CUDA runtime headers and libraries come with the target (no GPU is needed).
#include <cstdio>

#include <lowbit/comm/nccl_comm.hpp>

int main() {
  static_assert(lowbit::comm::nccl_data_type<float>() == ncclFloat32);
  int nccl = 0, cudart = 0;
  LOWBIT_NCCL_TRY(ncclGetVersion(&nccl));
  LOWBIT_CUDA_TRY(cudaRuntimeGetVersion(&cudart));
  lowbit::comm::nccl_comm empty;  // size 0 until it wraps a communicator
  std::printf("lowbit::nccl: NCCL %d, CUDA runtime %d, empty communicator of size %d\n", nccl,
              cudart, empty.size());
  return nccl >= 20000 && cudart > 0 && empty.size() == 0 ? 0 : 1;
}
