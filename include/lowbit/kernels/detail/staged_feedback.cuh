// Error-feedback refs whose state the kernels stage through registers.
//
// A ref reads and writes its state one element at a time (`load(i, x)`, `store(i, c,
// dq)`). Called on global memory from a lane that owns 32 consecutive values, those
// accesses would be 4-byte loads 128 bytes apart across the warp. For the refs lowbit
// ships, the kernels instead move the state tile in coalesced 16-byte vectors, bind a
// copy of the ref to the lane's 32 elements in registers, and call the ref's own
// load/store on that copy: the same arithmetic, so the same bits as the host.
#pragma once

#include <cstdint>

#include "lowbit/feedback/refs.hpp"

namespace lowbit::kernels::detail {

/// `value` is true for refs whose state is an array the kernels may stage; then
/// `state_type` is its element type, `state(f)` its pointer and `bind(p)` a ref onto p.
/// Other refs (user-defined) are called directly on global memory.
template <class F>
struct staged_feedback {
  static constexpr bool value = false;
  using state_type = float;
};

template <class R>
struct staged_feedback<feedback::residual_ref<R>> {
  static constexpr bool value = true;
  using state_type = R;
  LOWBIT_HD static R* state(const feedback::residual_ref<R>& f) { return f.e; }
  LOWBIT_HD static feedback::residual_ref<R> bind(R* p) { return feedback::residual_ref<R>{p}; }
};

template <class R>
struct staged_feedback<feedback::ef21_ref<R>> {
  static constexpr bool value = true;
  using state_type = R;
  LOWBIT_HD static R* state(const feedback::ef21_ref<R>& f) { return f.g; }
  LOWBIT_HD static feedback::ef21_ref<R> bind(R* p) { return feedback::ef21_ref<R>{p}; }
};

}  // namespace lowbit::kernels::detail
