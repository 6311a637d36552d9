// reduce_scatter handles for __nv_bfloat16 gradients with feedback none.
#include "collectives_impl.cuh"

namespace lowbit_torch {
template std::unique_ptr<shard_collective_handle>
make_reduce_scatter_as<__nv_bfloat16, lowbit::feedback::none>(const communicator&, std::int64_t,
                                                              const codec_choice&,
                                                              const collective_config&);
}  // namespace lowbit_torch
