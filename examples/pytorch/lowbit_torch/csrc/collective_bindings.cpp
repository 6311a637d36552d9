// The collectives' bindings: the communicator, AllReduce and ShardCollective (the handles
// and their dispatch onto the compiled cores are collectives.cpp's).
#include <torch/extension.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "bindings.h"
#include "choices.h"
#include "collectives.h"

namespace lowbit_torch {

namespace {

/// A Python all-gather as node_comm's bootstrap: `fn(mine: bytes) -> bytes` returns every
/// rank's bytes in rank order. Called with or without the GIL (it takes it); the Python
/// object is released with the GIL held, whichever thread drops the last copy.
struct python_allgather {
  std::shared_ptr<pybind11::object> fn;
  int size = 0;

  python_allgather(pybind11::function f, int ranks)
      : fn(new pybind11::object(std::move(f)),
           [](pybind11::object* p) {
             pybind11::gil_scoped_acquire gil;
             delete p;
           }),
        size(ranks) {}

  void operator()(const void* mine, void* all, std::size_t bytes) const {
    namespace py = pybind11;
    py::gil_scoped_acquire gil;
    const py::object got = (*fn)(py::bytes(static_cast<const char*>(mine), bytes));
    const std::string s = got.cast<std::string>();
    TORCH_CHECK(s.size() == bytes * static_cast<std::size_t>(size),
                "lowbit_torch: the bootstrap all-gather returned ", s.size(), " bytes where ", size,
                " ranks x ", bytes, " were expected");
    std::memcpy(all, s.data(), s.size());
  }
};

}  // namespace

void bind_collectives(pybind11::module_& m) {
  namespace py = pybind11;
  py::class_<communicator>(m, "Communicator")
      .def(py::init([](std::int64_t handle) {
             TORCH_CHECK_VALUE(handle != 0,
                               "lowbit_torch: the process group has no NCCL communicator yet "
                               "(create it eagerly with init_process_group(..., device_id=...) "
                               "or run one collective first)");
             return communicator(handle);
           }),
           py::arg("nccl_comm_ptr"))
      // The node backend's communicator: `allgather(mine: bytes) -> bytes` is the group's
      // all-gather (every rank's bytes, concatenated in rank order), which the Python
      // side runs over the process group's Store; it is called during this construction
      // and again while each collective on the communicator is built (never in a call).
      .def_static(
          "node",
          [](int rank, int size, py::function allgather) {
            return communicator(rank, size, python_allgather(std::move(allgather), size));
          },
          py::arg("rank"), py::arg("size"), py::arg("allgather"))
      .def_property_readonly("rank", &communicator::rank)
      .def_property_readonly("size", &communicator::size)
      .def_property_readonly("backend",
                             [](const communicator& c) { return backend_name(c.backend()); });

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
      .def("reset_feedback", &all_reduce_handle::reset_feedback)
      .def("load_state", &all_reduce_handle::load_state, py::arg("worker"), py::arg("replicated"),
           py::arg("step"))
      .def_property_readonly("last_stream", &all_reduce_handle::last_stream)
      .def_property_readonly("backend", &all_reduce_handle::backend)
      .def("reduced_shard", &all_reduce_handle::reduced_shard, py::arg("count"), py::arg("bits"))
      .def("stage2_state", &all_reduce_handle::stage2_state)
      .def("load_stage2_state", &all_reduce_handle::load_stage2_state, py::arg("state"));

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
      .def_property_readonly("dtype", &shard_collective_handle::dtype)
      // The step (stochastic rounding's key; each call adds one), settable for a resume,
      // and the feedback state as AllReduce's: a reduce_scatter with the residual rule
      // keeps the fp32 residual of every input value (max_count); others keep none.
      .def_property("step", &shard_collective_handle::step, &shard_collective_handle::set_step)
      .def("worker_state", &shard_collective_handle::worker_state, py::arg("count"))
      .def("replicated_state", &shard_collective_handle::replicated_state, py::arg("count"))
      .def("reset_feedback", &shard_collective_handle::reset_feedback)
      .def("load_state", &shard_collective_handle::load_state, py::arg("worker"),
           py::arg("replicated"), py::arg("step"))
      .def_property_readonly("last_stream", &shard_collective_handle::last_stream);
}

}  // namespace lowbit_torch
