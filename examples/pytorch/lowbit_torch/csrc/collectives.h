// Type-erased handles onto lowbit's collectives, as Python sees them: the backend (the
// communicator's), element type, codec and feedback are chosen at run time, each
// combination compiled once (one generated source per backend, element type and
// feedback, so they compile in parallel: the table in lowbit_torch/_build.py says which). Every
// call is enqueued on torch's current stream and returns at once.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common.h"
#include "instances.h"
#include "lowbit/collective/types.hpp"

namespace lowbit_torch {

/// What a Python caller configures on a collective besides codec and feedback.
struct collective_config {
  bool average = true;         ///< avg (x 1/P when decoding) or sum
  std::uint64_t seed = 0;      ///< stochastic rounding's seed
  std::int64_t crossover = 0;  ///< bytes below which the plain NCCL collective runs (NCCL only)
  std::string algorithm = "automatic";

  lowbit::collective_options options() const;
};

/// A lowbit::dynamic_all_reduce (widths 1, 2, 4, 8) for one tensor (a gradient bucket).
class all_reduce_handle {
 public:
  virtual ~all_reduce_handle() = default;
  /// Enqueues out = all-reduce(in) at `bits` on the current stream (in == out allowed).
  virtual void run(const at::Tensor& in, const at::Tensor& out, int bits) = 0;
  /// Measures the crossover at `bits` on this communicator (collective, synchronising:
  /// every rank calls it at the same point), sets it, and returns it in bytes.
  virtual std::int64_t calibrate(int bits, std::int64_t max_bytes) = 0;
  virtual std::int64_t crossover_bytes() const = 0;
  virtual void set_crossover_bytes(std::int64_t bytes) = 0;
  virtual std::int64_t max_count() const = 0;
  virtual std::int64_t step() const = 0;
  virtual at::ScalarType dtype() const = 0;
  virtual std::string algorithm() const = 0;
  /// A copy of the per-rank feedback state (residual e, or EF21's g_i) of the first
  /// `count` elements; an empty tensor when the feedback has none.
  virtual at::Tensor worker_state(std::int64_t count) const = 0;
  /// A copy of EF21's replicated g; empty for other feedback.
  virtual at::Tensor replicated_state(std::int64_t count) const = 0;
  virtual void reset_feedback() = 0;
  /// Restores what worker_state(), replicated_state() and step() returned (a checkpoint):
  /// the states' first numel() elements (CUDA tensors of the state's dtype; empty where the
  /// feedback has none) and the step, copied on the current stream.
  virtual void load_state(const at::Tensor& worker, const at::Tensor& replicated,
                          std::int64_t step) = 0;
  /// The cudaStream_t (as an integer) the last run() was enqueued on; 0 before any.
  virtual std::int64_t last_stream() const = 0;
  /// "nccl" or "node".
  virtual std::string backend() const = 0;
};

/// A lowbit::reduce_scatter or all_gather at one codec, for FSDP2's flat buffers.
class shard_collective_handle {
 public:
  virtual ~shard_collective_handle() = default;
  /// reduce_scatter: in has count values, out gets this rank's shard; all_gather: in is
  /// this rank's shard, out gets count values. Enqueued on the current stream.
  virtual void run(const at::Tensor& in, const at::Tensor& out) = 0;
  virtual std::int64_t max_count() const = 0;
  virtual at::ScalarType dtype() const = 0;
  /// [begin, end) of this rank's shard of a count-value tensor.
  virtual std::pair<std::int64_t, std::int64_t> shard(std::int64_t count) const = 0;
  /// The cudaStream_t (as an integer) the last run() was enqueued on; 0 before any.
  virtual std::int64_t last_stream() const = 0;
};

std::unique_ptr<all_reduce_handle> make_all_reduce(const communicator& comm, at::ScalarType dtype,
                                                   std::int64_t max_count,
                                                   const codec_choice& codec,
                                                   feedback_kind feedback,
                                                   const collective_config& config);

/// The factories per (backend tag, element type, feedback), each instantiated in its own
/// generated source.
template <class Backend, class T, class Feedback>
std::unique_ptr<all_reduce_handle> make_all_reduce_as(const communicator& comm,
                                                      std::int64_t max_count,
                                                      const codec_choice& codec,
                                                      const collective_config& config);

std::unique_ptr<shard_collective_handle> make_reduce_scatter(
    const communicator& comm, at::ScalarType dtype, std::int64_t max_count,
    const codec_choice& codec, feedback_kind feedback, const collective_config& config);
std::unique_ptr<shard_collective_handle> make_all_gather(const communicator& comm,
                                                         at::ScalarType dtype,
                                                         std::int64_t max_count,
                                                         const codec_choice& codec,
                                                         const collective_config& config);

template <class Backend, class T, class Feedback>
std::unique_ptr<shard_collective_handle> make_reduce_scatter_as(const communicator& comm,
                                                                std::int64_t max_count,
                                                                const codec_choice& codec,
                                                                const collective_config& config);
template <class Backend, class T>
std::unique_ptr<shard_collective_handle> make_all_gather_as(const communicator& comm,
                                                            std::int64_t max_count,
                                                            const codec_choice& codec,
                                                            const collective_config& config);

}  // namespace lowbit_torch
