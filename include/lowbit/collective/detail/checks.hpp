// The readable compile errors of the collectives' template parameters.
#pragma once

#include <type_traits>

#include "lowbit/codec/codec.hpp"
#include "lowbit/collective/types.hpp"
#include "lowbit/core/numeric.hpp"
#include "lowbit/feedback/state.hpp"
#include "lowbit/schedule/schedule.hpp"

namespace lowbit::detail {

template <class B>
inline constexpr bool is_backend_v =
    std::is_same_v<B, backend::nccl> || std::is_same_v<B, backend::mpi>;

template <class T, class Feedback, class Schedule, class Backend>
constexpr bool check_collective_params() {
  static_assert(is_element_type_v<T>,
                "lowbit collective: the element type T must be float, __half or __nv_bfloat16");
  static_assert(feedback::is_feedback_policy_v<Feedback>,
                "lowbit collective: Feedback must be lowbit::feedback::none, residual<R>, "
                "stage2_only<R> or ef21<R> (a policy, not a ref such as residual_ref)");
  static_assert(schedule::is_schedule_policy_v<Schedule>,
                "lowbit collective: Schedule must be lowbit::schedule::flat or pipelined<Chunks>");
  static_assert(is_backend_v<Backend>,
                "lowbit collective: Backend must be lowbit::backend::nccl or lowbit::backend::mpi");
  return true;
}

template <class Codec>
constexpr bool check_codec() {
  static_assert(is_codec_v<Codec>,
                "lowbit collective: Codec must be a lowbit::codec<Quantizer, Rounding>, e.g. "
                "lowbit::codec<lowbit::quant::absmax<4>, lowbit::round::stochastic>");
  return true;
}

}  // namespace lowbit::detail
