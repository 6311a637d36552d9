// The codec functions for float tensors (one file per type: they compile in parallel).
#include "codec_ops_impl.cuh"

namespace lowbit_torch {
LOWBIT_TORCH_INSTANTIATE_CODEC(float)
}  // namespace lowbit_torch
