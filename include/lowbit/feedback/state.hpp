// Error-feedback policies (the Feedback parameter of the collectives) and the state
// they own. The per-element hooks the encoders call are in refs.hpp.
//
//   none                  quantize the input itself
//   residual<R, Stage2>   classic EF: c = x + e; send Q(c); e = c - D(Q(c))
//   ef21<R, Stage2>       EF21: worker state g_i, send Q(x - g_i), g_i += D(Q(x - g_i));
//                         replicated state g += reduced, output g
//
// Stage2 adds a residual on the re-quantized reduced shard (r = s + e2; send Q(r);
// e2 = r - D(Q(r))), the shard owner's second quantization. EF21 turns it on by
// default: without it the re-quantization error of every step is added to the
// replicated g for good (nothing feeds it back), so g would not converge to the
// exact mean; with it the errors telescope and g does.
#pragma once

#include <cstddef>
#include <type_traits>

#include "lowbit/core/numeric.hpp"
#include "lowbit/feedback/refs.hpp"

namespace lowbit::feedback {

/// No error feedback.
struct none {
  static constexpr bool is_feedback_policy = true;
  static constexpr bool worker = false;      ///< has per-rank state over the tensor
  static constexpr bool replicated = false;  ///< has the replicated EF21 state g
  static constexpr bool stage2 = false;      ///< has a residual on the reduced shard
  using storage_type = float;
  using worker_ref_type = none_ref;
  static constexpr const char* name = "none";
};

/// Classic error feedback with residual storage R (float, or __nv_bfloat16 to halve
/// its memory traffic), optionally with the second-stage residual.
template <class R = float, bool Stage2 = false>
struct residual {
  static_assert(is_element_type_v<R>,
                "lowbit::feedback::residual<R>: the storage type R must be float, __half or "
                "__nv_bfloat16");
  static constexpr bool is_feedback_policy = true;
  static constexpr bool worker = true;
  static constexpr bool replicated = false;
  static constexpr bool stage2 = Stage2;
  using storage_type = R;
  using worker_ref_type = residual_ref<R>;
  static constexpr const char* name = Stage2 ? "residual+stage2" : "residual";
};

/// Only the second-stage residual (on the reduced shard), none on the inputs.
template <class R = float>
struct stage2_only {
  static_assert(is_element_type_v<R>,
                "lowbit::feedback::stage2_only<R>: R must be float, __half or __nv_bfloat16");
  static constexpr bool is_feedback_policy = true;
  static constexpr bool worker = false;
  static constexpr bool replicated = false;
  static constexpr bool stage2 = true;
  using storage_type = R;
  using worker_ref_type = none_ref;
  static constexpr const char* name = "stage2";
};

/// EF21 (Richtarik et al. 2021): worker state g_i and replicated state g (the output),
/// both fp32. R must be float: EF21 needs sum_i g_i == P * g, i.e. every increment a
/// rank sends must land in its g_i exactly; in bf16 the increment x - g_i never reaches
/// 0 (x is not a bf16 value), the rank keeps sending it, and g drifts linearly.
template <class R = float, bool Stage2 = true>
struct ef21 {
  static_assert(std::is_same_v<R, float>,
                "lowbit::feedback::ef21<R>: the worker state must be float: with a narrower "
                "type g_i cannot reach x, the residual increment is re-sent every step and "
                "the replicated g drifts (use feedback::residual<__nv_bfloat16> to save memory)");
  static constexpr bool is_feedback_policy = true;
  static constexpr bool worker = true;
  static constexpr bool replicated = true;
  static constexpr bool stage2 = Stage2;
  using storage_type = R;
  using worker_ref_type = ef21_ref<R>;
  static constexpr const char* name = Stage2 ? "ef21+stage2" : "ef21";
};

template <class F, class = void>
struct is_feedback_policy : std::false_type {};
template <class F>
struct is_feedback_policy<F, std::enable_if_t<F::is_feedback_policy>> : std::true_type {};
/// True for the policies above (the Feedback parameter of a collective).
template <class F>
inline constexpr bool is_feedback_policy_v = is_feedback_policy<F>::value;

/// The state a feedback policy owns inside one collective object, in buffers of the
/// backend's kind (`Buffer<U>(n)`: n zeroed U; `.data()`, `.size()`, `.zero()`).
///
/// worker:     per-rank state over the whole tensor (classic residual e, or EF21's g_i)
/// replicated: EF21's g over the whole tensor, fp32, identical on every rank
/// stage2:     residual of this rank's reduced shards (`stage2_count` elements)
template <class Policy, template <class> class Buffer>
class state {
  static_assert(is_feedback_policy_v<Policy>,
                "lowbit::feedback::state: Policy must be feedback::none, residual<>, "
                "stage2_only<> or ef21<>");
  using R = typename Policy::storage_type;

 public:
  state() = default;
  /// Allocates (zeroed) state for tensors of up to `max_count` elements of which this
  /// rank reduces up to `stage2_count`.
  state(std::size_t max_count, std::size_t stage2_count)
      : worker_(Policy::worker ? max_count : 0),
        replicated_(Policy::replicated ? max_count : 0),
        stage2_(Policy::stage2 ? stage2_count : 0) {}

  /// The encoder hook over the worker state, from element 0 of the tensor.
  typename Policy::worker_ref_type worker_ref() const {
    if constexpr (std::is_same_v<Policy, none> || !Policy::worker) {
      return {};
    } else {
      return {const_cast<R*>(worker_.data())};
    }
  }
  /// The encoder hook of the reduced shard's residual (none_ref when there is none).
  auto stage2_ref() const {
    if constexpr (Policy::stage2) {
      return residual_ref<R>{const_cast<R*>(stage2_.data())};
    } else {
      return none_ref{};
    }
  }
  /// EF21's replicated g (nullptr for other policies).
  float* replicated() const { return const_cast<float*>(replicated_.data()); }
  /// The second-stage residual, element i for value begin + i of the call's reduced shard
  /// (nullptr when there is none: another policy, or a collective that does not
  /// re-encode), and how many elements it holds. For a checkpoint or a re-sharding.
  R* stage2() const { return stage2_.size() ? const_cast<R*>(stage2_.data()) : nullptr; }
  std::size_t stage2_count() const noexcept { return stage2_.size(); }

  /// Bytes of state held.
  std::size_t bytes() const noexcept {
    return sizeof(R) * (worker_.size() + stage2_.size()) + sizeof(float) * replicated_.size();
  }

  /// Forgets all feedback (e.g. after a skipped step or a change of bucket layout).
  void reset() {
    worker_.zero();
    replicated_.zero();
    stage2_.zero();
  }

 private:
  Buffer<R> worker_;
  Buffer<float> replicated_;
  Buffer<R> stage2_;
};

}  // namespace lowbit::feedback
