// The readable compile errors of the collectives' template parameters.
//
// Each collective names its base class through a <collective>_params struct below. The
// struct's static_asserts say which parameter of which collective is wrong and, when it
// is recognisably another kind of lowbit type (a feedback policy where the schedule goes,
// a quantizer where the codec goes, ...), what it got. They fire when the base class is
// named, so before collective_base and the engine are instantiated: they are the first
// errors. The struct then builds the base from the valid parameters and stand-ins for
// the wrong ones (float, a 4-bit codec, feedback::none, schedule::flat), so that a wrong
// parameter gives that one error and not a cascade from inside the engine.
#pragma once

#include <type_traits>

#include "lowbit/codec/codec.hpp"
#include "lowbit/collective/types.hpp"
#include "lowbit/core/numeric.hpp"
#include "lowbit/feedback/state.hpp"
#include "lowbit/schedule/schedule.hpp"

namespace lowbit::detail {

/// Open to new backends: any tag deriving from lowbit::backend_tag (types.hpp).
template <class B>
inline constexpr bool is_backend_v = is_backend_tag_v<B>;

template <class W>
struct is_bit_widths : std::false_type {};
template <int... Bits>
struct is_bit_widths<bit_widths<Bits...>> : std::true_type {};
template <class W>
inline constexpr bool is_bit_widths_v = is_bit_widths<W>::value;

/// What kind of lowbit type a template parameter is, for the messages.
enum class param_kind {
  element,
  codec,
  quantizer,
  rounding,
  feedback,
  feedback_ref,
  schedule,
  backend,
  widths,
  other
};

template <class X>
constexpr param_kind kind_of() {
  if constexpr (is_element_type_v<X>) {
    return param_kind::element;
  } else if constexpr (is_codec_v<X>) {
    return param_kind::codec;
  } else if constexpr (quant::is_quantizer_v<X>) {
    return param_kind::quantizer;
  } else if constexpr (round::is_rounding_v<X>) {
    return param_kind::rounding;
  } else if constexpr (feedback::is_feedback_policy_v<X>) {
    return param_kind::feedback;
  } else if constexpr (feedback::is_feedback_ref_v<X>) {
    return param_kind::feedback_ref;
  } else if constexpr (schedule::is_schedule_policy_v<X>) {
    return param_kind::schedule;
  } else if constexpr (is_backend_v<X>) {
    return param_kind::backend;
  } else if constexpr (is_bit_widths_v<X>) {
    return param_kind::widths;
  } else {
    return param_kind::other;
  }
}

/// The first of Cs that is not a lowbit::codec (void when all are).
template <class... Cs>
struct first_non_codec {
  using type = void;
};
template <class C, class... Cs>
struct first_non_codec<C, Cs...> {
  using type = std::conditional_t<is_codec_v<C>, typename first_non_codec<Cs...>::type, C>;
};

/// True when C is not a codec (reported elsewhere) or has `Bits`-bit codes.
template <class C, int Bits>
constexpr bool codec_has_bits() {
  if constexpr (is_codec_v<C>) {
    return C::bits == Bits;
  } else {
    return true;
  }
}

// The parameters a collective's base is built with: the given ones where they are valid,
// else stand-ins (the error has been stated).
template <class T>
using valid_element_t = std::conditional_t<is_element_type_v<T>, T, float>;
template <class C, int Bits = 4>
using valid_codec_t =
    std::conditional_t<is_codec_v<C>, C, codec<quant::absmax<Bits>, round::nearest>>;
template <class F>
using valid_feedback_t = std::conditional_t<feedback::is_feedback_policy_v<F>, F, feedback::none>;
template <class S>
using valid_schedule_t = std::conditional_t<schedule::is_schedule_policy_v<S>, S, schedule::flat>;

/// The base of a collective whose Backend is wrong (there is no stand-in backend): it
/// keeps the engine from being instantiated with it; the collective's constructors do not
/// accept any communicator.
struct rejected_collective {
  struct comm_type {};
  struct stream_type {};
  template <class... Args>
  explicit rejected_collective(Args&&...) {}
};
/// Base<Backend, Params...>, or rejected_collective when Backend is not a backend tag.
template <template <class...> class Base, class Backend, class... Params>
using checked_base_t =
    std::conditional_t<is_backend_v<Backend>, Base<Backend, Params...>, rejected_collective>;

// The sentences, spelled once. A static_assert message must be a string literal, so the
// collective's name and the parameter's place are pasted in by the macros below.
#define LOWBIT_DETAIL_IS_ELEMENT "the element type (float, __half or __nv_bfloat16)"
#define LOWBIT_DETAIL_IS_CODEC                                                                 \
  "a codec (lowbit::codec<Quantizer, Rounding>, e.g. lowbit::codec<lowbit::quant::absmax<4>, " \
  "lowbit::round::stochastic>)"
#define LOWBIT_DETAIL_WRAP_QUANTIZER \
  ": wrap it in lowbit::codec<>, e.g. lowbit::codec<Quantizer, lowbit::round::stochastic>"
#define LOWBIT_DETAIL_IS_FEEDBACK                                                           \
  "a feedback policy (lowbit::feedback::none, the default, residual<R>, stage2_only<R> or " \
  "ef21<R>)"
#define LOWBIT_DETAIL_IS_SCHEDULE                                                            \
  "a schedule (lowbit::schedule::flat, pipelined<Chunks> or ramped<MaxChunks>; the default " \
  "is ramped<>)"
#define LOWBIT_DETAIL_IS_BACKEND                                                \
  "a backend tag (lowbit::backend::nccl, the default, lowbit::backend::mpi or " \
  "lowbit::backend::node)"

// One parameter X that must satisfy OK; WHAT is "the <n>th parameter of <collective> is
// <what it must be>". Exactly one assertion fails when X is wrong: the one naming its kind.
#define LOWBIT_DETAIL_CHECK_PARAM(X, OK, WHAT, QUANTIZER_HINT)                                 \
  static_assert((OK) || kind_of<X>() != param_kind::element, WHAT "; got an element type");    \
  static_assert((OK) || kind_of<X>() != param_kind::codec, WHAT "; got a codec");              \
  static_assert((OK) || kind_of<X>() != param_kind::quantizer,                                 \
                WHAT "; got a quantizer" QUANTIZER_HINT);                                      \
  static_assert((OK) || kind_of<X>() != param_kind::rounding, WHAT "; got a rounding policy"); \
  static_assert((OK) || kind_of<X>() != param_kind::feedback, WHAT "; got a feedback policy"); \
  static_assert((OK) || kind_of<X>() != param_kind::feedback_ref, WHAT                         \
                "; got a feedback ref (pass the policy, e.g. feedback::residual<R>, not "      \
                "residual_ref<R>)");                                                           \
  static_assert((OK) || kind_of<X>() != param_kind::schedule, WHAT "; got a schedule");        \
  static_assert((OK) || kind_of<X>() != param_kind::backend, WHAT "; got a backend tag");      \
  static_assert((OK) || kind_of<X>() != param_kind::widths,                                    \
                WHAT "; got a set of code widths (lowbit::bit_widths<...>)");                  \
  static_assert((OK) || kind_of<X>() != param_kind::other, WHAT)

#define LOWBIT_DETAIL_CHECK_ELEMENT(WHO, NTH, T)     \
  LOWBIT_DETAIL_CHECK_PARAM(T, is_element_type_v<T>, \
                            "the " NTH " parameter of " WHO " is " LOWBIT_DETAIL_IS_ELEMENT, "")
#define LOWBIT_DETAIL_CHECK_CODEC(WHO, NTH, C)                                             \
  LOWBIT_DETAIL_CHECK_PARAM(C, is_codec_v<C>,                                              \
                            "the " NTH " parameter of " WHO " is " LOWBIT_DETAIL_IS_CODEC, \
                            LOWBIT_DETAIL_WRAP_QUANTIZER)
#define LOWBIT_DETAIL_CHECK_FEEDBACK(WHO, NTH, F)                 \
  LOWBIT_DETAIL_CHECK_PARAM(F, feedback::is_feedback_policy_v<F>, \
                            "the " NTH " parameter of " WHO " is " LOWBIT_DETAIL_IS_FEEDBACK, "")
#define LOWBIT_DETAIL_CHECK_SCHEDULE(WHO, NTH, S)                 \
  LOWBIT_DETAIL_CHECK_PARAM(S, schedule::is_schedule_policy_v<S>, \
                            "the " NTH " parameter of " WHO " is " LOWBIT_DETAIL_IS_SCHEDULE, "")
#define LOWBIT_DETAIL_CHECK_BACKEND(WHO, NTH, B) \
  LOWBIT_DETAIL_CHECK_PARAM(B, is_backend_v<B>,  \
                            "the " NTH " parameter of " WHO " is " LOWBIT_DETAIL_IS_BACKEND, "")

/// lowbit::all_reduce<T, Codec, Feedback, Schedule, Backend>.
template <class T, class Codec, class Feedback, class Schedule, class Backend>
struct all_reduce_params {
  LOWBIT_DETAIL_CHECK_ELEMENT("lowbit::all_reduce", "first", T);
  LOWBIT_DETAIL_CHECK_CODEC("lowbit::all_reduce", "second", Codec);
  LOWBIT_DETAIL_CHECK_FEEDBACK("lowbit::all_reduce", "third", Feedback);
  LOWBIT_DETAIL_CHECK_SCHEDULE("lowbit::all_reduce", "fourth", Schedule);
  LOWBIT_DETAIL_CHECK_BACKEND("lowbit::all_reduce", "fifth", Backend);
  template <template <class...> class Base>
  using base = checked_base_t<Base, Backend, valid_element_t<T>, valid_feedback_t<Feedback>,
                              valid_schedule_t<Schedule>, valid_codec_t<Codec>>;
};

/// lowbit::reduce_scatter<T, Codec, Feedback, Schedule, Backend>.
template <class T, class Codec, class Feedback, class Schedule, class Backend>
struct reduce_scatter_params {
  LOWBIT_DETAIL_CHECK_ELEMENT("lowbit::reduce_scatter", "first", T);
  LOWBIT_DETAIL_CHECK_CODEC("lowbit::reduce_scatter", "second", Codec);
  LOWBIT_DETAIL_CHECK_FEEDBACK("lowbit::reduce_scatter", "third", Feedback);
  LOWBIT_DETAIL_CHECK_SCHEDULE("lowbit::reduce_scatter", "fourth", Schedule);
  LOWBIT_DETAIL_CHECK_BACKEND("lowbit::reduce_scatter", "fifth", Backend);
  template <template <class...> class Base>
  using base = checked_base_t<Base, Backend, valid_element_t<T>, valid_feedback_t<Feedback>,
                              valid_schedule_t<Schedule>, valid_codec_t<Codec>>;
};

/// lowbit::all_gather<T, Codec, Schedule, Backend> (no feedback: a weight is gathered,
/// not accumulated).
template <class T, class Codec, class Schedule, class Backend>
struct all_gather_params {
  LOWBIT_DETAIL_CHECK_ELEMENT("lowbit::all_gather", "first", T);
  LOWBIT_DETAIL_CHECK_CODEC("lowbit::all_gather", "second", Codec);
  LOWBIT_DETAIL_CHECK_SCHEDULE("lowbit::all_gather", "third", Schedule);
  LOWBIT_DETAIL_CHECK_BACKEND("lowbit::all_gather", "fourth", Backend);
  template <template <class...> class Base>
  using base = checked_base_t<Base, Backend, valid_element_t<T>, feedback::none,
                              valid_schedule_t<Schedule>, valid_codec_t<Codec>>;
};

/// lowbit::dynamic_all_reduce<T, CodecOf, Widths, Feedback, Schedule, Backend>, whose
/// Widths is not a lowbit::bit_widths (the primary template).
template <class Widths>
struct dynamic_all_reduce_widths {
  LOWBIT_DETAIL_CHECK_PARAM(Widths, is_bit_widths_v<Widths>,
                            "the third parameter of lowbit::dynamic_all_reduce is a set of code "
                            "widths (lowbit::bit_widths<Bits...>, the default <1, 2, 4, 8>)",
                            "");
};

/// lowbit::dynamic_all_reduce<T, CodecOf, bit_widths<Bits...>, Feedback, Schedule,
/// Backend>.
template <class T, template <int> class CodecOf, class Feedback, class Schedule, class Backend,
          int... Bits>
struct dynamic_all_reduce_params {
  LOWBIT_DETAIL_CHECK_ELEMENT("lowbit::dynamic_all_reduce", "first", T);
  using non_codec = typename first_non_codec<CodecOf<Bits>...>::type;
  LOWBIT_DETAIL_CHECK_PARAM(non_codec, (std::is_void_v<non_codec>),
                            "the second parameter of lowbit::dynamic_all_reduce maps a width b "
                            "to a codec (CodecOf<b> is a lowbit::codec<Quantizer, Rounding> of b "
                            "bits)",
                            ": make CodecOf an alias such as template <int b> using codec_of = "
                            "lowbit::codec<lowbit::quant::absmax<b>, lowbit::round::stochastic>");
  static_assert((codec_has_bits<CodecOf<Bits>, Bits>() && ...),
                "the second parameter of lowbit::dynamic_all_reduce maps a width b to a codec "
                "of b bits; CodecOf<b> has codes of another width");
  LOWBIT_DETAIL_CHECK_FEEDBACK("lowbit::dynamic_all_reduce", "fourth", Feedback);
  LOWBIT_DETAIL_CHECK_SCHEDULE("lowbit::dynamic_all_reduce", "fifth", Schedule);
  LOWBIT_DETAIL_CHECK_BACKEND("lowbit::dynamic_all_reduce", "sixth", Backend);
  template <template <class...> class Base>
  using base = checked_base_t<Base, Backend, valid_element_t<T>, valid_feedback_t<Feedback>,
                              valid_schedule_t<Schedule>, valid_codec_t<CodecOf<Bits>, Bits>...>;
};

#undef LOWBIT_DETAIL_CHECK_BACKEND
#undef LOWBIT_DETAIL_CHECK_SCHEDULE
#undef LOWBIT_DETAIL_CHECK_FEEDBACK
#undef LOWBIT_DETAIL_CHECK_CODEC
#undef LOWBIT_DETAIL_CHECK_ELEMENT
#undef LOWBIT_DETAIL_CHECK_PARAM

/// The backstop collective_base states (the collectives' own checks above come first
/// and name the parameter; these name only its role).
template <class T, class Feedback, class Schedule, class Backend>
constexpr bool check_collective_params() {
  static_assert(is_element_type_v<T>,
                "lowbit collective: the element type T must be float, __half or __nv_bfloat16");
  static_assert(feedback::is_feedback_policy_v<Feedback>,
                "lowbit collective: Feedback must be " LOWBIT_DETAIL_IS_FEEDBACK
                " (a policy, not a ref such as residual_ref)");
  static_assert(schedule::is_schedule_policy_v<Schedule>,
                "lowbit collective: Schedule must be " LOWBIT_DETAIL_IS_SCHEDULE);
  static_assert(is_backend_v<Backend>,
                "lowbit collective: Backend must be " LOWBIT_DETAIL_IS_BACKEND);
  return true;
}

template <class Codec>
constexpr bool check_codec() {
  static_assert(is_codec_v<Codec>, "lowbit collective: Codec must be " LOWBIT_DETAIL_IS_CODEC);
  return true;
}

#undef LOWBIT_DETAIL_IS_BACKEND
#undef LOWBIT_DETAIL_IS_SCHEDULE
#undef LOWBIT_DETAIL_IS_FEEDBACK
#undef LOWBIT_DETAIL_WRAP_QUANTIZER
#undef LOWBIT_DETAIL_IS_CODEC
#undef LOWBIT_DETAIL_IS_ELEMENT

}  // namespace lowbit::detail
