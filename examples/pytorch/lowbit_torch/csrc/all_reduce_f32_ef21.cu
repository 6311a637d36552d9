// all_reduce handles for float gradients with feedback ef21.
#include "collectives_impl.cuh"

namespace lowbit_torch {
template std::unique_ptr<all_reduce_handle>
make_all_reduce_as<float, lowbit::feedback::ef21<float>>(const communicator&, std::int64_t,
                                                         const codec_choice&,
                                                         const collective_config&);
}  // namespace lowbit_torch
