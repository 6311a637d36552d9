// Everything in lowbit that compiles with a plain C++ compiler: core types, the codec,
// the host executor and the frame-transport policy. lowbit::lowbit is all it needs: no
// CUDA, NCCL, MPI or JSON library, and never includes nccl.h. (Where CUDA's headers are on
// the include path anyway, it uses them for __half / __nv_bfloat16 and the LOWBIT_CUDA_TRY
// macros.) CUDA kernels and NCCL collectives are in lowbit.cuh (lowbit::nccl).
#pragma once

#include "lowbit/codec/codec.hpp"
#include "lowbit/core/config.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/numeric.hpp"
#include "lowbit/core/span.hpp"
#include "lowbit/feedback/refs.hpp"
#include "lowbit/host/codec_executor.hpp"
#include "lowbit/transport/nccl/policy.hpp"
#include "lowbit/version.hpp"
