// Python's string and number choices turned into the extension's run-time choices, each
// checked with a ValueError naming the argument and what is allowed.
#pragma once

#include <cstdint>
#include <string>

#include "common.h"
#include "instances.h"  // generated from lowbit_torch/_build.py's table

namespace lowbit_torch {

inline codec_choice make_codec(int bits, const std::string& grid, const std::string& rounding) {
  TORCH_CHECK_VALUE(bits == 1 || bits == 2 || bits == 4 || bits == 8,
                    "lowbit_torch: bits must be 1, 2, 4 or 8, got ", bits);
  TORCH_CHECK_VALUE(grid == "zero" || grid == "full",
                    "lowbit_torch: grid must be 'zero' or 'full', got '", grid, "'");
  TORCH_CHECK_VALUE(rounding == "nearest" || rounding == "stochastic",
                    "lowbit_torch: rounding must be 'nearest' or 'stochastic', got '", rounding,
                    "'");
  return {bits, grid == "zero", rounding == "stochastic"};
}

inline feedback_kind make_feedback(const std::string& f) {
  feedback_kind kind{};
  TORCH_CHECK_VALUE(feedback_of(f, kind), "lowbit_torch: feedback must be ", feedback_names,
                    ", got '", f, "'");
  return kind;
}

/// The codec's dispatch: calls f(tag<T>{}) with the instance of Instances (instances.h)
/// compiled for dtype; a TypeError naming the dtypes compiled where there is none (hint:
/// what to do instead).
template <class Instances, class F>
void with_instance(const char* what, at::ScalarType dtype, F&& f, const char* hint = "") {
  const bool compiled = Instances::visit(dtype, f);
  TORCH_CHECK_TYPE(compiled, what, ": compiled for ", Instances::dtypes, " tensors, got ", dtype,
                   hint);
}

/// The collectives' dispatch (a backend first): calls f(tag<Backend>{}, tag<T>{}) with
/// the instance of Instances compiled for the communicator's backend and dtype; a
/// TypeError naming the dtypes compiled on that backend where there is none.
template <class Instances, class F>
void with_collective(const char* what, backend_kind b, at::ScalarType dtype, F&& f,
                     const char* hint = "") {
  TORCH_CHECK_VALUE(Instances::has_backend(b), what, " is not compiled for the ", backend_name(b),
                    " backend (lowbit_torch/_build.py's BACKENDS)");
  TORCH_CHECK_TYPE(Instances::has_dtype(b, dtype), what, ": compiled on the ", backend_name(b),
                   " backend for ", Instances::dtypes(b), " tensors, got ", dtype, hint);
  const bool compiled = Instances::visit(b, dtype, f);
  TORCH_CHECK_TYPE(compiled, what, ": no instance for ", dtype, hint);
}

/// The same with a feedback rule: f(tag<Backend>{}, tag<T>{}, tag<Feedback>{}); a
/// ValueError naming the rules compiled on that backend where the rule is not.
template <class Instances, class F>
void with_collective(const char* what, backend_kind b, at::ScalarType dtype, feedback_kind feedback,
                     F&& f, const char* hint = "") {
  TORCH_CHECK_VALUE(Instances::has_backend(b), what, " is not compiled for the ", backend_name(b),
                    " backend (lowbit_torch/_build.py's BACKENDS)");
  TORCH_CHECK_TYPE(Instances::has_dtype(b, dtype), what, ": compiled on the ", backend_name(b),
                   " backend for ", Instances::dtypes(b), " tensors, got ", dtype, hint);
  const bool compiled = Instances::visit(b, dtype, feedback, f);
  TORCH_CHECK_VALUE(compiled, what, ": feedback on the ", backend_name(b), " backend must be ",
                    Instances::feedback(b));
}

inline collective_config make_config(bool average, std::uint64_t seed, std::int64_t crossover,
                                     const std::string& algorithm) {
  TORCH_CHECK_VALUE(crossover >= 0, "lowbit_torch: crossover must be >= 0 bytes, got ", crossover);
  TORCH_CHECK_VALUE(algorithm == "automatic" || algorithm == "one_shot" || algorithm == "two_phase",
                    "lowbit_torch: algorithm must be 'automatic', 'one_shot' or 'two_phase', "
                    "got '",
                    algorithm, "'");
  return {average, seed, crossover, algorithm};
}

inline void check_max_count(std::int64_t max_count) {
  TORCH_CHECK_VALUE(max_count > 0, "lowbit_torch: max_count must be > 0, got ", max_count);
}

}  // namespace lowbit_torch
