// all_gather handles for __nv_bfloat16 parameters.
#include "collectives_impl.cuh"

namespace lowbit_torch {
template std::unique_ptr<shard_collective_handle> make_all_gather_as<__nv_bfloat16>(
    const communicator&, std::int64_t, const codec_choice&, const collective_config&);
}  // namespace lowbit_torch
