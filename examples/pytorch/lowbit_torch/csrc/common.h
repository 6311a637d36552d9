// What the torch glue shares (the .cpp sources, compiled once by the host compiler): the
// torch-free core (core.h) seen from torch: dtypes, tensor checks that raise Python
// exceptions (ValueError / TypeError / RuntimeError) naming the argument, and torch's
// current stream. The element types and feedback rules compiled are in the generated
// instances.h.
#pragma once

// ATen's and c10's own headers, not torch/extension.h: the glue that binds nothing to
// Python (collectives.cpp) compiles in a fraction of the time without torch's whole API.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "core.h"

namespace lowbit_torch {

/// The torch dtype of a core's element type.
inline at::ScalarType scalar_type(dtype_kind k) {
  switch (k) {
    case dtype_kind::float32:
      return at::kFloat;
    case dtype_kind::float16:
      return at::kHalf;
    case dtype_kind::bfloat16:
      return at::kBFloat16;
  }
  TORCH_CHECK(false, "lowbit_torch: unknown dtype_kind");
}

/// The torch dtype of T.
template <class T>
at::ScalarType scalar_type_of() {
  return scalar_type(dtype_of<T>());
}

/// A dense CUDA tensor on the current device, of dtype `dtype`.
inline void check_cuda_tensor(const at::Tensor& t, at::ScalarType dtype, const char* what,
                              const char* name) {
  TORCH_CHECK_VALUE(t.defined(), what, ": ", name, " is undefined");
  TORCH_CHECK_VALUE(t.is_cuda(), what, ": ", name, " must be a CUDA tensor, got ", t.device());
  TORCH_CHECK_VALUE(t.is_contiguous(), what, ": ", name, " must be contiguous");
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, what, ": ", name, " has dtype ", t.scalar_type(),
                   " where ", dtype, " was expected");
  TORCH_CHECK_VALUE(t.get_device() == c10::cuda::current_device(), what, ": ", name,
                    " is on cuda:", t.get_device(),
                    " but the current device is cuda:", c10::cuda::current_device());
}

/// Raw pointer to a tensor's data as T.
template <class T>
T* data_as(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

/// torch's current stream on the current device: lowbit's work is ordered with the
/// training step's own kernels there.
inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

}  // namespace lowbit_torch
