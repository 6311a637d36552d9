// The CUDA codec kernels: fused encode, decode and decode-accumulate-encode over device
// buffers, bit-identical to lowbit/host/codec_executor.hpp.
#pragma once

#include "lowbit/kernels/decode.cuh"
#include "lowbit/kernels/encode.cuh"
#include "lowbit/kernels/launch_policy.cuh"
#include "lowbit/kernels/reduce.cuh"
