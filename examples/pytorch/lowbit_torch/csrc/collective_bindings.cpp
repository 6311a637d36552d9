// The collectives' bindings: the communicator, AllReduce and ShardCollective, and the
// run-time dispatch from Python's choices onto the compiled handles.
#include <torch/extension.h>

#include <cstdint>
#include <memory>
#include <string>

#include "choices.h"
#include "collectives.h"
#include "lowbit/codec/absmax.hpp"

namespace lowbit_torch {

lowbit::collective_options collective_config::options() const {
  lowbit::collective_options o;
  o.op = average ? lowbit::reduce_op::avg : lowbit::reduce_op::sum;
  o.seed = seed;
  o.crossover_bytes = static_cast<std::size_t>(crossover);
  o.algorithm = algorithm == "one_shot"    ? lowbit::all_reduce_algorithm::one_shot
                : algorithm == "two_phase" ? lowbit::all_reduce_algorithm::two_phase
                                           : lowbit::all_reduce_algorithm::automatic;
  return o;
}

std::unique_ptr<all_reduce_handle> make_all_reduce(const communicator& comm, at::ScalarType dtype,
                                                   std::int64_t max_count,
                                                   const codec_choice& codec,
                                                   feedback_kind feedback,
                                                   const collective_config& config) {
  check_max_count(max_count);
  return with_dtype(dtype, "lowbit_torch all_reduce", [&](auto t) {
    using T = typename decltype(t)::type;
    using namespace lowbit::feedback;
    switch (feedback) {
      case feedback_kind::none:
        return make_all_reduce_as<T, none>(comm, max_count, codec, config);
      case feedback_kind::residual_f32:
        return make_all_reduce_as<T, residual<float>>(comm, max_count, codec, config);
      case feedback_kind::residual_bf16:
        return make_all_reduce_as<T, residual<__nv_bfloat16>>(comm, max_count, codec, config);
      case feedback_kind::residual_stage2:
        return make_all_reduce_as<T, residual<float, true>>(comm, max_count, codec, config);
      case feedback_kind::ef21:
        break;
    }
    return make_all_reduce_as<T, ef21<float>>(comm, max_count, codec, config);
  });
}

namespace {

/// FSDP2 reduces in float32 or bfloat16 (its reduce_dtype); those are compiled.
template <class F>
decltype(auto) with_fsdp_dtype(at::ScalarType t, const char* what, F&& f) {
  if (t == at::kFloat) return f(tag<float>{});
  TORCH_CHECK_TYPE(t == at::kBFloat16, what,
                   ": the FSDP collectives are compiled for float32 and bfloat16, got ", t,
                   " (set MixedPrecisionPolicy(reduce_dtype=torch.float32 or torch.bfloat16))");
  return f(tag<__nv_bfloat16>{});
}

}  // namespace

std::unique_ptr<shard_collective_handle> make_reduce_scatter(
    const communicator& comm, at::ScalarType dtype, std::int64_t max_count,
    const codec_choice& codec, feedback_kind feedback, const collective_config& config) {
  check_max_count(max_count);
  TORCH_CHECK_VALUE(feedback == feedback_kind::none || feedback == feedback_kind::residual_f32,
                    "lowbit_torch reduce_scatter: feedback must be 'none' or 'residual'");
  return with_fsdp_dtype(dtype, "lowbit_torch reduce_scatter", [&](auto t) {
    using T = typename decltype(t)::type;
    if (feedback == feedback_kind::none)
      return make_reduce_scatter_as<T, lowbit::feedback::none>(comm, max_count, codec, config);
    return make_reduce_scatter_as<T, lowbit::feedback::residual<float>>(comm, max_count, codec,
                                                                        config);
  });
}

std::unique_ptr<shard_collective_handle> make_all_gather(const communicator& comm,
                                                         at::ScalarType dtype,
                                                         std::int64_t max_count,
                                                         const codec_choice& codec,
                                                         const collective_config& config) {
  check_max_count(max_count);
  return with_fsdp_dtype(dtype, "lowbit_torch all_gather", [&](auto t) {
    using T = typename decltype(t)::type;
    return make_all_gather_as<T>(comm, max_count, codec, config);
  });
}

void bind_collectives(pybind11::module_& m) {
  namespace py = pybind11;
  py::class_<communicator>(m, "Communicator")
      .def(py::init<std::int64_t>(), py::arg("nccl_comm_ptr"))
      .def_property_readonly("rank", &communicator::rank)
      .def_property_readonly("size", &communicator::size);

  py::class_<all_reduce_handle>(m, "AllReduce")
      .def(py::init([](const communicator& comm, at::ScalarType dtype, std::int64_t max_count,
                       const std::string& grid, const std::string& rounding,
                       const std::string& feedback, bool average, std::uint64_t seed,
                       std::int64_t crossover, const std::string& algorithm) {
             return make_all_reduce(comm, dtype, max_count, make_codec(4, grid, rounding),
                                    make_feedback(feedback),
                                    make_config(average, seed, crossover, algorithm));
           }),
           py::arg("comm"), py::arg("dtype"), py::arg("max_count"), py::arg("grid"),
           py::arg("rounding"), py::arg("feedback"), py::arg("average"), py::arg("seed"),
           py::arg("crossover"), py::arg("algorithm"))
      .def("run", &all_reduce_handle::run, py::arg("input"), py::arg("output"), py::arg("bits"))
      .def("calibrate", &all_reduce_handle::calibrate, py::arg("bits"), py::arg("max_bytes"))
      .def_property("crossover_bytes", &all_reduce_handle::crossover_bytes,
                    &all_reduce_handle::set_crossover_bytes)
      .def_property_readonly("max_count", &all_reduce_handle::max_count)
      .def_property_readonly("step", &all_reduce_handle::step)
      .def_property_readonly("dtype", &all_reduce_handle::dtype)
      .def_property_readonly("algorithm", &all_reduce_handle::algorithm)
      .def("worker_state", &all_reduce_handle::worker_state, py::arg("count"))
      .def("replicated_state", &all_reduce_handle::replicated_state, py::arg("count"))
      .def("reset_feedback", &all_reduce_handle::reset_feedback);

  py::class_<shard_collective_handle>(m, "ShardCollective")
      .def_static(
          "reduce_scatter",
          [](const communicator& comm, at::ScalarType dtype, std::int64_t max_count, int bits,
             const std::string& grid, const std::string& rounding, const std::string& feedback,
             bool average, std::uint64_t seed) {
            return make_reduce_scatter(comm, dtype, max_count, make_codec(bits, grid, rounding),
                                       make_feedback(feedback),
                                       make_config(average, seed, 0, "automatic"));
          },
          py::arg("comm"), py::arg("dtype"), py::arg("max_count"), py::arg("bits"), py::arg("grid"),
          py::arg("rounding"), py::arg("feedback"), py::arg("average"), py::arg("seed"))
      .def_static(
          "all_gather",
          [](const communicator& comm, at::ScalarType dtype, std::int64_t max_count, int bits,
             const std::string& grid, const std::string& rounding, std::uint64_t seed) {
            return make_all_gather(comm, dtype, max_count, make_codec(bits, grid, rounding),
                                   make_config(false, seed, 0, "automatic"));
          },
          py::arg("comm"), py::arg("dtype"), py::arg("max_count"), py::arg("bits"), py::arg("grid"),
          py::arg("rounding"), py::arg("seed"))
      .def("run", &shard_collective_handle::run, py::arg("input"), py::arg("output"))
      .def("shard", &shard_collective_handle::shard, py::arg("count"))
      .def_property_readonly("max_count", &shard_collective_handle::max_count)
      .def_property_readonly("dtype", &shard_collective_handle::dtype);
}

}  // namespace lowbit_torch
