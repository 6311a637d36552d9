// The "lowbit" torch.distributed backend: a c10d::Backend that runs all-reduce,
// reduce-scatter and all-gather of large floating CUDA tensors through lowbit's collectives
// and forwards every other call, unchanged, to an inner c10d::Backend (NCCL's, or gloo's
// where ranks share a GPU). Pure host code without CUDA headers: the lowbit path is reached
// through lowbit_collectives, implemented over the compiled handles in
// process_group_collectives.cpp, so this header and process_group.cpp also build against a
// CPU-only torch (the CPU tests build them to check the forwarding).
#pragma once

#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lowbit_torch {

/// The operations the backend may run through lowbit (lowbit_torch/backend.py's OPS, in
/// the same order).
enum class lowbit_op { all_reduce, reduce_scatter, all_gather };

/// A call's reduction as the routing sees it: none (all-gather), sum, avg, or another
/// (MAX, MIN, PRODUCT, PREMUL_SUM, bitwise: always forwarded).
enum class reduce_kind { none, sum, avg, other };

/// Which calls take the lowbit path: per operation the dtypes it runs at (empty: the
/// operation is always forwarded) and the smallest tensor, in bytes, it takes. Built by
/// lowbit_torch/backend.py's routes(), whose route() states the same rule in Python.
struct route_table {
  std::array<std::vector<at::ScalarType>, 3> dtypes;
  std::int64_t min_bytes = 0;

  /// Whether a call of `op` on `nbytes` bytes (the whole tensor: the all-reduced one, the
  /// reduce-scatter's input, the all-gather's output) of `dtype` reducing by `reduce`
  /// takes the lowbit path. The tensors' layout is checked apart (process_group.cpp).
  bool takes(lowbit_op op, at::ScalarType dtype, std::int64_t nbytes, reduce_kind reduce) const;
};

/// The lowbit path: each call is enqueued on the current stream (the backend's own) and
/// returns at once. Tensors are contiguous CUDA tensors on the current device, of a dtype
/// the route table admits for the operation; reduce_scatter's input holds size() equal
/// chunks, all_gather's output size() copies of the input's size.
class lowbit_collectives {
 public:
  virtual ~lowbit_collectives() = default;
  virtual void all_reduce(const at::Tensor& tensor, bool average) = 0;
  virtual void reduce_scatter(const at::Tensor& output, const at::Tensor& input, bool average) = 0;
  virtual void all_gather(const at::Tensor& output, const at::Tensor& input) = 0;
  /// "nccl" or "node": the lowbit backend the collectives run on.
  virtual std::string backend() const = 0;
  /// Collectives built so far, per kind ("built_all_reduce", ...); "feedback_tensors": how
  /// many tensors hold feedback state now; "feedback_dropped": states evicted.
  virtual std::vector<std::pair<std::string, std::int64_t>> counters() const = 0;
};

/// The backend: `inner` takes every call the route table does not give to `lowbit`
/// (null: every call is forwarded); `device` is the CUDA device the lowbit path runs on.
c10::intrusive_ptr<c10d::Backend> make_process_group(c10::intrusive_ptr<c10d::Backend> inner,
                                                     std::shared_ptr<lowbit_collectives> lowbit,
                                                     route_table routes, c10::Device device);

/// The Python bindings of the backend (the route table, make_process_group, its counters).
void bind_process_group(pybind11::module_& m);

}  // namespace lowbit_torch
