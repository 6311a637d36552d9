// encode-probe: the encode kernel alone on 1 GiB of input, one GPU: median of 15
// CUDA-event-timed launches after 3 warm-ups, for the codecs the collectives' default
// configurations use, beside a device-to-device copy of the same size (the HBM ceiling,
// read + write); then the 4-bit decode and the one-shot all_reduce's decode-sum of two
// frames into the same 1 GiB of bf16. Not installed: it explains the codec rows of
// docs/performance.md. codec_bench (Google Benchmark) times the same kernels over more sizes and
// codecs; this is the short single-size table those rows quote.
//
//   encode-probe
#include <algorithm>
#include <cstdio>
#include <vector>

#include <lowbit/lowbit.cuh>
namespace lb = lowbit;
template <int B>
using SR = lb::codec<lb::quant::absmax<B>, lb::round::stochastic>;
template <int B>
using RN = lb::codec<lb::quant::absmax<B>>;
template <class F>
float timeit(F f) {
  cudaEvent_t a, b;
  LOWBIT_CUDA_TRY(cudaEventCreate(&a));
  LOWBIT_CUDA_TRY(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> v;
  for (int r = 0; r < 15; ++r) {
    LOWBIT_CUDA_TRY(cudaEventRecord(a));
    f();
    LOWBIT_CUDA_TRY(cudaEventRecord(b));
    LOWBIT_CUDA_TRY(cudaEventSynchronize(b));
    float ms;
    LOWBIT_CUDA_TRY(cudaEventElapsedTime(&ms, a, b));
    v.push_back(ms * 1e3f);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
__global__ void fill(__nv_bfloat16* x, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    unsigned h = (unsigned)(i * 2654435761u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    x[i] = __float2bfloat16(((int)(h & 0xffff) - 32768) * (1.0f / 32768.0f));
  }
}
int main() {
  const std::size_t n = std::size_t(1) << 29;
  __nv_bfloat16 *x, *r;
  std::byte* fr;
  LOWBIT_CUDA_TRY(cudaMalloc(&x, n * 2));
  LOWBIT_CUDA_TRY(cudaMalloc(&r, n * 2));
  LOWBIT_CUDA_TRY(cudaMalloc(&fr, SR<8>::frame_bytes(n)));
  fill<<<1024, 256>>>(x, n);
  LOWBIT_CHECK_LAUNCH();
  LOWBIT_CUDA_TRY(cudaMemset(r, 0, n * 2));
  lb::rng_key k{1, 2, 3, 0};
  auto none = lb::feedback::none_ref{};
  std::printf("encode us (2^29 bf16 = 1 GiB; fp32 rows 2^28 = 1 GiB)\n");
  std::printf("bf16 4b SR        %.1f\n",
              timeit([&] { lb::kernels::encode<SR<4>>(x, n, fr, k, 0, none, nullptr); }));
  std::printf("bf16 4b nearest   %.1f\n",
              timeit([&] { lb::kernels::encode<RN<4>>(x, n, fr, k, 0, none, nullptr); }));
  std::printf("bf16 2b SR        %.1f\n",
              timeit([&] { lb::kernels::encode<SR<2>>(x, n, fr, k, 0, none, nullptr); }));
  std::printf("bf16 8b SR        %.1f\n",
              timeit([&] { lb::kernels::encode<SR<8>>(x, n, fr, k, 0, none, nullptr); }));
  std::printf("bf16 4b SR resid  %.1f\n", timeit([&] {
                lb::kernels::encode<SR<4>>(x, n, fr, k, 0,
                                           lb::feedback::residual_ref<__nv_bfloat16>{r}, nullptr);
              }));
  std::printf("fp32 4b SR        %.1f\n", timeit([&] {
                lb::kernels::encode<SR<4>, float>((const float*)x, n / 2, fr, k, 0, none, nullptr);
              }));
  std::printf("copy 1 GiB        %.1f\n", timeit([&] {
                LOWBIT_CUDA_TRY(cudaMemcpyAsync(r, x, n * 2, cudaMemcpyDeviceToDevice));
              }));
  // The one-shot all_reduce's last pass on 2 ranks: two 4-bit frames summed into bf16.
  const std::size_t stride = SR<4>::frame_bytes(n);
  std::byte* two;
  LOWBIT_CUDA_TRY(cudaMalloc(&two, 2 * stride));
  lb::kernels::encode<SR<4>>(x, n, two, k, 0, none, nullptr);
  lb::kernels::encode<SR<4>>(x, n, two + stride, k, 0, none, nullptr);
  std::printf("decode 4b -> bf16  %.1f\n",
              timeit([&] { lb::kernels::decode<SR<4>>(two, n, r, 1.0f, nullptr); }));
  std::printf("decode-sum 2 x 4b  %.1f\n", timeit([&] {
                lb::kernels::decode_accumulate<SR<4>>(two, stride, 2, n, r, 1.0f, nullptr);
              }));
  LOWBIT_CUDA_TRY(cudaDeviceSynchronize());
  cudaFree(two);
  cudaFree(x);
  cudaFree(r);
  cudaFree(fr);
  return 0;
}
