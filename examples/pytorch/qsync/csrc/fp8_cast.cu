// The fp8 linear's operand cast in one pass: q = fp8(clamp(x / scale, -max, max)), written
// row-major and, optionally, transposed. torch's own expression of the same cast
// ((x.float() / scale).clamp(...).to(fp8), then .t().contiguous() for the transposed
// operand an fp8 GEMM wants) takes five passes with fp32 temporaries and a 1-byte
// transpose copy that runs at a few percent of HBM bandwidth; the wgrad GEMM needs both of
// its operands transposed, so those copies, not the GEMMs, set the fp8 linear's time.
//
// Bits: the same as torch's expression. The division is IEEE (x / s, round to nearest, as
// torch's CUDA division), the clamp keeps NaN, and the conversion is c10's own
// (c10::Float8_e4m3fn / c10::Float8_e5m2 from float, round to nearest even): what
// Tensor.to() runs, or in newer torch the hardware conversion, which rounds the same on
// every finite value the clamp lets through (tests/qsync/test_fp8.py compares the bits).
//
// This file holds the kernel and its launch; fp8_cast.cpp checks the inputs and binds the
// function (pybind11 code and every error a caller sees compile with the host compiler).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <cstdint>

namespace {

constexpr int tile = 64;       // a CTA's tile: tile x tile values
constexpr int threads_x = 32;  // a warp along the columns, two columns a lane
constexpr int threads_y = 8;   // rows y, y + 8, ..., y + 56

template <typename F8>
__device__ inline std::uint8_t cast(float x, float scale, float max) {
  float v = __fdiv_rn(x, scale);  // IEEE division whatever the flags, as torch's kernel
  // torch's clamp: NaN stays NaN (fminf/fmaxf would drop it)
  v = v != v ? v : (v < -max ? -max : (v > max ? max : v));
  return F8(v).x;
}

// One tile: load (coalesced along the row), cast, store row-major, and through shared
// memory store the transpose (coalesced along its rows). Rows of the staging tile are
// padded by 4 bytes so that the column reads of the transpose fall in distinct banks.
template <typename T, typename F8>
__global__ void __launch_bounds__(threads_x* threads_y)
    cast_kernel(const T* __restrict__ x, std::int64_t rows, std::int64_t cols,
                const float* __restrict__ scale_ptr, float max, std::uint8_t* __restrict__ q,
                std::uint8_t* __restrict__ qt) {
  __shared__ std::uint8_t staged[tile][tile + 4];
  const float scale = *scale_ptr;
  const std::int64_t row0 = std::int64_t(blockIdx.y) * tile;
  const std::int64_t col0 = std::int64_t(blockIdx.x) * tile;
  const int c = 2 * threadIdx.x;
  // a lane's two bytes go out as one 2-byte store where the row length keeps it aligned
  const bool pairs = cols % 2 == 0 && col0 + c + 1 < cols;
  for (int r = threadIdx.y; r < tile; r += threads_y) {
    const std::int64_t row = row0 + r;
    if (row >= rows) break;
    const std::int64_t at = row * cols + col0 + c;
    if (pairs) {
      const std::uint8_t b0 = cast<F8>(static_cast<float>(x[at]), scale, max);
      const std::uint8_t b1 = cast<F8>(static_cast<float>(x[at + 1]), scale, max);
      *reinterpret_cast<std::uint16_t*>(q + at) = std::uint16_t(b0 | (b1 << 8));
      staged[r][c] = b0;
      staged[r][c + 1] = b1;
      continue;
    }
    for (int k = 0; k < 2 && col0 + c + k < cols; ++k) {
      const std::uint8_t b = cast<F8>(static_cast<float>(x[at + k]), scale, max);
      q[at + k] = b;
      staged[r][c + k] = b;
    }
  }
  if (qt == nullptr) return;
  __syncthreads();
  // qt is [cols, rows]: its row col0 + r holds the tile's column r
  const bool tpairs = rows % 2 == 0 && row0 + c + 1 < rows;
  for (int r = threadIdx.y; r < tile; r += threads_y) {
    const std::int64_t trow = col0 + r;
    if (trow >= cols) break;
    const std::int64_t at = trow * rows + row0 + c;
    if (tpairs) {
      *reinterpret_cast<std::uint16_t*>(qt + at) =
          std::uint16_t(staged[c][r] | (staged[c + 1][r] << 8));
      continue;
    }
    for (int k = 0; k < 2 && row0 + c + k < rows; ++k) qt[at + k] = staged[c + k][r];
  }
}

template <typename F8>
void launch(const at::Tensor& x, const at::Tensor& scale, double max, at::Tensor& q,
            at::Tensor* qt) {
  const std::int64_t rows = x.size(0), cols = x.size(1);
  const dim3 grid((cols + tile - 1) / tile, (rows + tile - 1) / tile);
  const dim3 block(threads_x, threads_y);
  auto stream = at::cuda::getCurrentCUDAStream();
  std::uint8_t* qp = static_cast<std::uint8_t*>(q.data_ptr());
  std::uint8_t* qtp = qt ? static_cast<std::uint8_t*>(qt->data_ptr()) : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fp8_cast", [&] {
    cast_kernel<scalar_t, F8><<<grid, block, 0, stream>>>(x.data_ptr<scalar_t>(), rows, cols,
                                                          scale.data_ptr<float>(),
                                                          static_cast<float>(max), qp, qtp);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

// q (and qt where not null) from x: the inputs as fp8_cast.cpp checked them.
void fp8_cast_launch(const at::Tensor& x, const at::Tensor& scale, at::ScalarType fmt, double max,
                     at::Tensor& q, at::Tensor* qt) {
  if (fmt == at::kFloat8_e4m3fn)
    launch<c10::Float8_e4m3fn>(x, scale, max, q, qt);
  else
    launch<c10::Float8_e5m2>(x, scale, max, q, qt);
}
