// The codec functions for __nv_bfloat16 tensors (one file per type: they compile in parallel).
#include "codec_ops_impl.cuh"

namespace lowbit_torch {
LOWBIT_TORCH_INSTANTIATE_CODEC(__nv_bfloat16)
}  // namespace lowbit_torch
