// all_reduce handles for __nv_bfloat16 gradients with feedback residual_bf16.
#include "collectives_impl.cuh"

namespace lowbit_torch {
template std::unique_ptr<all_reduce_handle>
make_all_reduce_as<__nv_bfloat16, lowbit::feedback::residual<__nv_bfloat16>>(
    const communicator&, std::int64_t, const codec_choice&, const collective_config&);
}  // namespace lowbit_torch
