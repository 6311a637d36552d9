// reduce_scatter handles for float gradients with feedback residual_f32.
#include "collectives_impl.cuh"

namespace lowbit_torch {
template std::unique_ptr<shard_collective_handle>
make_reduce_scatter_as<float, lowbit::feedback::residual<float>>(const communicator&, std::int64_t,
                                                                 const codec_choice&,
                                                                 const collective_config&);
}  // namespace lowbit_torch
