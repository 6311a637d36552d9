// Python's string and number choices turned into the extension's run-time choices, each
// checked with a ValueError naming the argument and what is allowed.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <string>

#include "collectives.h"
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

/// Calls f(tag<T>{}) with the instance of Instances (instances.h) compiled for dtype; a
/// TypeError naming the dtypes compiled where there is none (hint: what to do instead).
template <class Instances, class F>
void with_instance(const char* what, at::ScalarType dtype, F&& f, const char* hint = "") {
  const bool compiled = Instances::visit(dtype, f);
  TORCH_CHECK_TYPE(compiled, what, ": compiled for ", Instances::dtypes, " tensors, got ", dtype,
                   hint);
}

/// Calls f(tag<T>{}, tag<Feedback>{}) with the instance of Instances compiled for dtype
/// and feedback: a TypeError for a dtype not compiled, a ValueError for a feedback rule.
template <class Instances, class F>
void with_instance(const char* what, at::ScalarType dtype, feedback_kind feedback, F&& f,
                   const char* hint = "") {
  TORCH_CHECK_TYPE(Instances::has_dtype(dtype), what, ": compiled for ", Instances::dtypes,
                   " tensors, got ", dtype, hint);
  const bool compiled = Instances::visit(dtype, feedback, f);
  TORCH_CHECK_VALUE(compiled, what, ": feedback must be ", Instances::feedback);
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

/// The bindings of each part of the module (bindings.cpp calls them).
void bind_codec(pybind11::module_& m);
void bind_collectives(pybind11::module_& m);

}  // namespace lowbit_torch
