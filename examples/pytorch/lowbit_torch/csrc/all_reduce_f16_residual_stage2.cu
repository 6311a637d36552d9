// all_reduce handles for __half gradients with feedback residual_stage2 (the shard owner's
// second quantization has a residual too).
#include "collectives_impl.cuh"

namespace lowbit_torch {
template std::unique_ptr<all_reduce_handle>
make_all_reduce_as<__half, lowbit::feedback::residual<float, true>>(const communicator&,
                                                                    std::int64_t,
                                                                    const codec_choice&,
                                                                    const collective_config&);
}  // namespace lowbit_torch
