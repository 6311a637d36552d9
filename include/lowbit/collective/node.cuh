// The low-bit collectives on the node backend: the ranks of one node as processes that map
// each other's workspace with CUDA IPC, no NCCL (device buffers, cudaStream_t). Several
// ranks may share one GPU.
//
//   lowbit::comm::node_comm comm = lowbit::comm::node_comm_from_mpi(MPI_COMM_WORLD);
//   lowbit::node::all_reduce<float, codec> reduce(comm, max_count);
//   reduce.async(d_in, d_out, count, stream);   // enqueued on stream
//   reduce.sync(stream);                        // raises a timeout, never hangs
//
// The hierarchical collectives take it inside each node (node::hierarchical_all_reduce),
// with the node backend, NCCL or MPI across nodes.
#pragma once

#include "lowbit/collective/all_gather.hpp"
#include "lowbit/collective/all_reduce.hpp"
#include "lowbit/collective/detail/backend_node.cuh"
#include "lowbit/collective/detail/hierarchical_node.cuh"
#include "lowbit/collective/hierarchical.hpp"
#include "lowbit/collective/reduce_scatter.hpp"
#include "lowbit/comm/node_comm.hpp"

namespace lowbit::node {

/// The collectives with the node backend filled in.
template <class T, class Codec, class Feedback = feedback::none,
          class Schedule = schedule::default_schedule>
using all_reduce = lowbit::all_reduce<T, Codec, Feedback, Schedule, backend::node>;
template <class T, class Codec, class Feedback = feedback::none,
          class Schedule = schedule::default_schedule>
using reduce_scatter = lowbit::reduce_scatter<T, Codec, Feedback, Schedule, backend::node>;
template <class T, class Codec, class Schedule = schedule::default_schedule>
using all_gather = lowbit::all_gather<T, Codec, Schedule, backend::node>;
template <class T, template <int> class CodecOf, class Widths = bit_widths<1, 2, 4, 8>,
          class Feedback = feedback::none, class Schedule = schedule::default_schedule>
using dynamic_all_reduce =
    lowbit::dynamic_all_reduce<T, CodecOf, Widths, Feedback, Schedule, backend::node>;
/// The hierarchical collectives with the node backend inside each node and `Across`
/// between nodes (the node backend too by default: nodes made of groups of ranks of one
/// machine, as the tests do). Across real nodes: backend::nccl (with
/// lowbit/collective/nccl.cuh), or backend::mpi (with lowbit/collective/mpi.hpp: stage 2
/// runs on the host over pinned copies of the rail shard, operator() only, the bits of
/// mpi::hierarchical_all_reduce).
template <class T, class InterCodec, class Feedback = feedback::none,
          class IntraCodec = full_precision, class Schedule = schedule::default_schedule,
          class Across = backend::node>
using hierarchical_all_reduce = lowbit::hierarchical_all_reduce<T, InterCodec, Feedback, IntraCodec,
                                                                Schedule, Across, backend::node>;
template <class T, class InterCodec, class Feedback = feedback::none,
          class IntraCodec = full_precision, class Schedule = schedule::default_schedule,
          class Across = backend::node>
using hierarchical_reduce_scatter =
    lowbit::hierarchical_reduce_scatter<T, InterCodec, Feedback, IntraCodec, Schedule, Across,
                                        backend::node>;

}  // namespace lowbit::node
