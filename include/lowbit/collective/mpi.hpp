// The low-bit collectives on the host (MPI) backend: host buffers, plain C++.
//
//   lowbit::comm::mpi_comm comm(MPI_COMM_WORLD);
//   lowbit::all_reduce<float, codec, lowbit::feedback::none, lowbit::schedule::flat,
//                      lowbit::backend::mpi> reduce(comm, max_count);
//   reduce(in, out, count);
#pragma once

#include "lowbit/collective/all_gather.hpp"
#include "lowbit/collective/all_reduce.hpp"
#include "lowbit/collective/detail/backend_mpi.hpp"
#include "lowbit/collective/detail/hierarchical_mpi.hpp"
#include "lowbit/collective/hierarchical.hpp"
#include "lowbit/collective/reduce_scatter.hpp"
#include "lowbit/comm/mpi_comm.hpp"
#include "lowbit/comm/mpi_nodes.hpp"

namespace lowbit::mpi {

/// The collectives with the host backend filled in.
template <class T, class Codec, class Feedback = feedback::none,
          class Schedule = schedule::default_schedule>
using all_reduce = lowbit::all_reduce<T, Codec, Feedback, Schedule, backend::mpi>;
template <class T, class Codec, class Feedback = feedback::none,
          class Schedule = schedule::default_schedule>
using reduce_scatter = lowbit::reduce_scatter<T, Codec, Feedback, Schedule, backend::mpi>;
template <class T, class Codec, class Schedule = schedule::default_schedule>
using all_gather = lowbit::all_gather<T, Codec, Schedule, backend::mpi>;
template <class T, template <int> class CodecOf, class Widths = bit_widths<1, 2, 4, 8>,
          class Feedback = feedback::none, class Schedule = schedule::default_schedule>
using dynamic_all_reduce =
    lowbit::dynamic_all_reduce<T, CodecOf, Widths, Feedback, Schedule, backend::mpi>;
template <class T, class InterCodec, class Feedback = feedback::none,
          class IntraCodec = full_precision, class Schedule = schedule::default_schedule>
using hierarchical_all_reduce =
    lowbit::hierarchical_all_reduce<T, InterCodec, Feedback, IntraCodec, Schedule, backend::mpi>;
template <class T, class InterCodec, class Feedback = feedback::none,
          class IntraCodec = full_precision, class Schedule = schedule::default_schedule>
using hierarchical_reduce_scatter =
    lowbit::hierarchical_reduce_scatter<T, InterCodec, Feedback, IntraCodec, Schedule,
                                        backend::mpi>;

}  // namespace lowbit::mpi
