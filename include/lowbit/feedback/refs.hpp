// Error-feedback hooks that encoders call per element: trivially copyable, non-owning
// handles ("refs") onto feedback state, usable in CUDA kernels and host loops alike.
//
// An encoder asks `load(i, x)` for the value to quantize (c), quantizes it, and, when
// the block is finite, calls `store(i, c, dq)` with the value the receiver will decode.
// Index i counts from the first element of the encoded range. The owning state objects
// (allocation, reset) live in lowbit/feedback/state.hpp.
#pragma once

#include <cstddef>
#include <type_traits>

#include "lowbit/core/config.hpp"
#include "lowbit/core/float_ops.hpp"
#include "lowbit/core/numeric.hpp"

namespace lowbit::feedback {

/// No feedback: quantize x itself.
struct none_ref {
  static constexpr bool active = false;
  LOWBIT_HD float load(std::size_t, float x) const { return x; }
  LOWBIT_HD void store(std::size_t, float, float) const {}
  /// The same ref starting `offset` elements later (to encode one shard).
  LOWBIT_HD none_ref shifted(std::size_t) const { return *this; }
};

/// Classic error feedback: c = x + e; after sending Q(c), e = c - D(Q(c)).
/// The residual's storage type R is float or bfloat16 (half the HBM traffic).
template <class R = float>
struct residual_ref {
  static_assert(is_element_type_v<R>,
                "lowbit::feedback::residual_ref: R must be float or bfloat16");
  static constexpr bool active = true;
  R* e = nullptr;
  LOWBIT_HD float load(std::size_t i, float x) const { return detail::fadd(x, to_float(e[i])); }
  LOWBIT_HD void store(std::size_t i, float c, float dq) const {
    e[i] = from_float<R>(detail::fsub(c, dq));
  }
  LOWBIT_HD residual_ref shifted(std::size_t offset) const { return {e + offset}; }
};

/// EF21 (Richtarik et al., 2021), the worker side: local state g_i; send Q(x - g_i);
/// g_i += D(Q(x - g_i)). The replicated state g += reduced lives with the collective.
template <class R = float>
struct ef21_ref {
  static_assert(is_element_type_v<R>, "lowbit::feedback::ef21_ref: R must be float or bfloat16");
  static constexpr bool active = true;
  R* g = nullptr;
  LOWBIT_HD float load(std::size_t i, float x) const { return detail::fsub(x, to_float(g[i])); }
  LOWBIT_HD void store(std::size_t i, float, float dq) const {
    g[i] = from_float<R>(detail::fadd(to_float(g[i]), dq));
  }
  LOWBIT_HD ef21_ref shifted(std::size_t offset) const { return {g + offset}; }
};

/// True for the refs above (and user refs that declare `active`).
template <class F, class = void>
struct is_feedback_ref : std::false_type {};
template <class F>
struct is_feedback_ref<F, std::void_t<decltype(F::active)>> : std::true_type {};
template <class F>
inline constexpr bool is_feedback_ref_v = is_feedback_ref<F>::value;

}  // namespace lowbit::feedback
