// All of lowbit: the host-safe part plus CUDA kernels and NCCL collectives.
#pragma once

#include "lowbit/collective/nccl.cuh"
#include "lowbit/kernels/kernels.cuh"
#include "lowbit/lowbit.hpp"
#include "lowbit/transport/nccl/frame_mover.cuh"
