// Everything in lowbit that compiles with a plain C++ compiler: core types, the codec,
// the host executor and the frame-transport policy. CUDA kernels and NCCL collectives are in lowbit.cuh.
#pragma once

#include "lowbit/codec/codec.hpp"
#include "lowbit/core/config.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/numeric.hpp"
#include "lowbit/core/span.hpp"
#include "lowbit/feedback/refs.hpp"
#include "lowbit/host/codec_executor.hpp"
#include "lowbit/transport/policy.hpp"
#include "lowbit/version.hpp"
