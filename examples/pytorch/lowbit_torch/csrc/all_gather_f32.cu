// all_gather handles for float parameters.
#include "collectives_impl.cuh"

namespace lowbit_torch {
template std::unique_ptr<shard_collective_handle> make_all_gather_as<float>(
    const communicator&, std::int64_t, const codec_choice&, const collective_config&);
}  // namespace lowbit_torch
