// The fp8 linear's operand cast with its current scale, two passes over the input:
//   1. amax = max |x| (NaN kept: it orders above every finite value and inf as bits)
//   2. scale = amax > 0 ? amax * (1 / max) : 1, q = fp8(clamp(x / scale, -max, max)),
//      written row-major and, optionally, transposed with the transpose's rows padded
//      to a multiple of 16 with zeros (the weight-gradient GEMM reduces over them, and
//      fp8 GEMMs want that dimension a multiple of 16; zeros add nothing to the sums).
// torch's expression of the same (abs, amax, where, division, clamp, .to(fp8), then
// .t().contiguous()) takes seven launches, fp32 temporaries and a 1-byte transpose far
// below memory bandwidth; each launch also costs the host ~10 us, which for the small
// operands of a training step is more than the GPU's time.
//
// Bits: those of qsync.fp8.quantize. The scale is amax times the fp32 reciprocal of the
// format's max (one rounding each, as quantize computes it), the division is IEEE (x / s,
// round to nearest), the clamp keeps NaN, and the conversion is c10's own
// (c10::Float8_e4m3fn / c10::Float8_e5m2 from float, round to nearest even): what
// Tensor.to() runs (tests/qsync/test_fp8.py compares the bits).
//
// This file holds the kernels and their launches; fp8_cast.cpp checks the inputs and binds
// the function (pybind11 code and every error a caller sees compile with the host compiler).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <cstdint>

namespace {

// A thread's chunk: 8 consecutive values of a row, one or two 16-byte loads and one 8-byte
// store of fp8 (16-byte loads keep enough bytes in flight to run at HBM bandwidth).
constexpr int chunk = 8;
constexpr int threads = 256;
// The cast's tile: 64 x 64 values, 8 chunks a row, 32 rows a pass of the CTA's threads.
constexpr int tile = 64;
constexpr int chunks_per_row = tile / chunk;
constexpr int rows_per_pass = threads / chunks_per_row;
// The staging tile's row is padded to 68 bytes: a warp's column reads for the transpose
// (8 chunks of rows, 4 columns) then meet at most two to a bank, where 64 would put 8.
constexpr int staged_row = tile + 4;

template <typename T>
struct Chunk {
  static_assert(sizeof(T) * chunk % 16 == 0, "a chunk is whole 16-byte words");
  uint4 words[sizeof(T) * chunk / 16];
  __device__ float operator[](int k) const {
    return static_cast<float>(reinterpret_cast<const T*>(words)[k]);
  }
};

// 8 bytes as two little-endian words (registers, not a local array in memory)
__device__ inline uint2 pack(const std::uint8_t (&b)[chunk]) {
  return make_uint2(b[0] | b[1] << 8 | b[2] << 16 | unsigned(b[3]) << 24,
                    b[4] | b[5] << 8 | b[6] << 16 | unsigned(b[7]) << 24);
}

template <typename T>
__device__ inline Chunk<T> load_chunk(const T* p) {
  Chunk<T> c;
  const uint4* w = reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int i = 0; i < int(sizeof(c.words) / 16); ++i) c.words[i] = __ldg(w + i);
  return c;
}

// |v| as bits: the order of non-negative floats, with every NaN above +inf
__device__ inline unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

__device__ inline unsigned warp_max(unsigned v) {
#pragma unroll
  for (int d = 16; d > 0; d /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, d));
  return v;
}

// Pass 1: max |x| as bits into *out (zeroed before the launch), one atomic per CTA.
template <typename T>
__global__ void __launch_bounds__(threads)
    amax_kernel(const T* __restrict__ x, std::int64_t n, bool vectors, unsigned* out) {
  unsigned m = 0;
  const std::int64_t stride = std::int64_t(gridDim.x) * threads;
  const std::int64_t first = std::int64_t(blockIdx.x) * threads + threadIdx.x;
  std::int64_t tail = 0;  // where the scalar loop starts
  if (vectors) {
    const std::int64_t chunks = n / chunk;
    for (std::int64_t i = first; i < chunks; i += stride) {
      const Chunk<T> c = load_chunk(x + i * chunk);
#pragma unroll
      for (int k = 0; k < chunk; ++k) m = max(m, abs_bits(c[k]));
    }
    tail = chunks * chunk;
  }
  for (std::int64_t i = tail + first; i < n; i += stride)
    m = max(m, abs_bits(static_cast<float>(x[i])));
  __shared__ unsigned warps[threads / 32];
  m = warp_max(m);
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = warp_max(threadIdx.x < threads / 32 ? warps[threadIdx.x] : 0u);
    if (threadIdx.x == 0) atomicMax(out, m);
  }
}

template <typename F8>
__device__ inline std::uint8_t cast(float x, float scale, float max) {
  float v = __fdiv_rn(x, scale);  // IEEE division whatever the flags, as torch's kernel
  // torch's clamp: NaN stays NaN (fminf/fmaxf would drop it)
  v = v != v ? v : (v < -max ? -max : (v > max ? max : v));
  return F8(v).x;
}

// Pass 2, one tile a CTA (row tiles on the grid's x, column tiles on its y): each thread
// casts chunks of a row (coalesced along it), stores them row-major and stages them in
// shared memory; then each thread gathers 8 staged rows of one column into a chunk of the
// transpose (coalesced along the transpose's rows). `vectors`: the rows are whole chunks
// and x is 16-byte aligned, so chunks load and store as words; otherwise value by value.
template <typename T, typename F8>
__global__ void __launch_bounds__(threads)
    cast_kernel(const T* __restrict__ x, std::int64_t rows, std::int64_t cols, std::int64_t rows_t,
                bool vectors, const unsigned* __restrict__ amax_bits, float inv_max, float max,
                std::uint8_t* __restrict__ q, std::uint8_t* __restrict__ qt,
                float* __restrict__ scale_out) {
  __shared__ alignas(4) std::uint8_t staged[tile][staged_row];
  const float amax = __uint_as_float(*amax_bits);
  const float scale = amax > 0.0f ? __fmul_rn(amax, inv_max) : 1.0f;  // NaN: 1, as quantize
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_out = scale;
  const std::int64_t row0 = std::int64_t(blockIdx.x) * tile;
  const std::int64_t col0 = std::int64_t(blockIdx.y) * tile;
  const int cx = threadIdx.x % chunks_per_row;
  const std::int64_t col = col0 + cx * chunk;
  // the tile's rows in two passes of the CTA; both passes' loads are issued before either
  // pass's casts, so a thread has twice the bytes in flight
  constexpr int passes = tile / rows_per_pass;
  const int r0 = threadIdx.x / chunks_per_row;
  Chunk<T> loaded[passes];
  if (vectors) {
#pragma unroll
    for (int p = 0; p < passes; ++p) {
      const std::int64_t row = row0 + r0 + p * rows_per_pass;
      if (row < rows && col < cols) loaded[p] = load_chunk(x + row * cols + col);
    }
  }
#pragma unroll
  for (int p = 0; p < passes; ++p) {
    const int r = r0 + p * rows_per_pass;
    const std::int64_t row = row0 + r;
    std::uint8_t b[chunk] = {};  // zeros where the tile passes the edge: the transpose's pad
    if (row < rows && col < cols) {
      const std::int64_t at = row * cols + col;
      if (vectors) {
#pragma unroll
        for (int k = 0; k < chunk; ++k) b[k] = cast<F8>(loaded[p][k], scale, max);
        *reinterpret_cast<uint2*>(q + at) = pack(b);
      } else {
#pragma unroll
        for (int k = 0; k < chunk; ++k) {
          if (col + k < cols) {
            b[k] = cast<F8>(static_cast<float>(x[at + k]), scale, max);
            q[at + k] = b[k];
          }
        }
      }
    }
    const uint2 words = pack(b);
    unsigned* s = reinterpret_cast<unsigned*>(&staged[r][cx * chunk]);
    s[0] = words.x;
    s[1] = words.y;
  }
  if (qt == nullptr) return;
  __syncthreads();
  // qt is [cols, rows_t]: its row col0 + j holds the tile's column j, rows rows..rows_t
  // zero (staged as zeros above); rows_t is a multiple of 16, so its chunks are whole
  const int ci = threadIdx.x % chunks_per_row;
  const std::int64_t tcol = row0 + ci * chunk;
  if (tcol >= rows_t) return;
  for (int j = threadIdx.x / chunks_per_row; j < tile; j += rows_per_pass) {
    const std::int64_t trow = col0 + j;
    if (trow >= cols) break;
    std::uint8_t b[chunk];
#pragma unroll
    for (int k = 0; k < chunk; ++k) b[k] = staged[ci * chunk + k][j];
    *reinterpret_cast<uint2*>(qt + trow * rows_t + tcol) = pack(b);
  }
}

template <typename T, typename F8>
void launch(const at::Tensor& x, double inv_max, double max, at::Tensor& q, at::Tensor* qt,
            at::Tensor& scale) {
  const std::int64_t rows = x.size(0), cols = x.size(1), n = x.numel();
  const T* xp = static_cast<const T*>(x.data_ptr());
  const bool aligned = reinterpret_cast<std::uintptr_t>(xp) % 16 == 0;
  auto stream = at::cuda::getCurrentCUDAStream();
  auto amax = at::empty({1}, x.options().dtype(at::kInt));
  unsigned* amax_bits = reinterpret_cast<unsigned*>(amax.data_ptr<int>());
  C10_CUDA_CHECK(cudaMemsetAsync(amax_bits, 0, sizeof(unsigned), stream));

  // pass 1: enough CTAs to fill the GPU a few times over, each striding the tensor
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const std::int64_t work = aligned ? n / chunk : n;
  const int blocks = int(std::max<std::int64_t>(
      1, std::min<std::int64_t>((work + threads - 1) / threads, std::int64_t(sms) * 8)));
  amax_kernel<T><<<blocks, threads, 0, stream>>>(xp, n, aligned, amax_bits);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  const dim3 grid((rows + tile - 1) / tile, (cols + tile - 1) / tile);
  std::uint8_t* qtp = qt ? static_cast<std::uint8_t*>(qt->data_ptr()) : nullptr;
  const std::int64_t rows_t = qt ? qt->size(1) : rows;
  cast_kernel<T, F8><<<grid, threads, 0, stream>>>(
      xp, rows, cols, rows_t, aligned && cols % chunk == 0, amax_bits, static_cast<float>(inv_max),
      static_cast<float>(max), static_cast<std::uint8_t*>(q.data_ptr()), qtp,
      scale.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename F8>
void launch_for(const at::Tensor& x, double inv_max, double max, at::Tensor& q, at::Tensor* qt,
                at::Tensor& scale) {
  switch (x.scalar_type()) {
    case at::kFloat:
      return launch<float, F8>(x, inv_max, max, q, qt, scale);
    case at::kBFloat16:
      return launch<c10::BFloat16, F8>(x, inv_max, max, q, qt, scale);
    case at::kHalf:
      return launch<c10::Half, F8>(x, inv_max, max, q, qt, scale);
    default:
      TORCH_CHECK(false, "qsync fp8_cast: no kernel for ", x.scalar_type());
  }
}

}  // namespace

// q, qt (where not null) and scale from x: the inputs as fp8_cast.cpp checked them, x not
// empty.
void fp8_cast_launch(const at::Tensor& x, at::ScalarType fmt, double inv_max, double max,
                     at::Tensor& q, at::Tensor* qt, at::Tensor& scale) {
  if (fmt == at::kFloat8_e4m3fn)
    launch_for<c10::Float8_e4m3fn>(x, inv_max, max, q, qt, scale);
  else
    launch_for<c10::Float8_e5m2>(x, inv_max, max, q, qt, scale);
}
