// The low-bit collectives on the NCCL backend (device buffers, cudaStream_t).
//
//   lowbit::comm::nccl_comm comm(raw_nccl_comm);          // borrowed
//   using codec = lowbit::codec<lowbit::quant::absmax<4>, lowbit::round::stochastic>;
//   lowbit::all_reduce<float, codec, lowbit::feedback::residual<>> reduce(comm, max_count);
//   reduce(d_in, d_out, count, stream);        // returns when d_out holds the result
//   reduce.async(d_in, d_out, count, stream);  // or: enqueued on stream, returns at once,
//   reduce.sync(stream);                       // then waited for (deadline, NCCL errors)
#pragma once

#include "lowbit/collective/all_gather.hpp"
#include "lowbit/collective/all_reduce.hpp"
#include "lowbit/collective/calibrate.cuh"
#include "lowbit/collective/detail/backend_nccl.cuh"
#include "lowbit/collective/detail/hierarchical_nccl.cuh"
#include "lowbit/collective/hierarchical.hpp"
#include "lowbit/collective/reduce_scatter.hpp"
#include "lowbit/comm/nccl_comm.hpp"
#include "lowbit/comm/nccl_nodes.hpp"
