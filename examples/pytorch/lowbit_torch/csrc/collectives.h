// Handles onto lowbit's collectives, as Python sees them: the backend (the
// communicator's), element type, codec and feedback are chosen at run time; each handle
// checks its tensors and enqueues the call on torch's current stream through a core
// (core.h) compiled once per combination (one generated source per backend, element type
// and feedback, so they compile in parallel: the table in lowbit_torch/_build.py says
// which). Every call returns at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "common.h"
#include "instances.h"

namespace lowbit_torch {

// The step and feedback state of any core, as tensors (collectives.cpp).
at::Tensor worker_state_of(stateful_core& core, std::int64_t count);
at::Tensor replicated_state_of(stateful_core& core, std::int64_t count);
void load_state_of(stateful_core& core, const at::Tensor& worker, const at::Tensor& replicated,
                   std::int64_t step);
void set_step_of(stateful_core& core, std::int64_t step);

/// What AllReduce and ShardCollective share: the core, and its step and feedback state as
/// Python reads them for a checkpoint and restores them on a resume.
template <class Core>
class stateful_handle {
 public:
  std::int64_t max_count() const { return static_cast<std::int64_t>(core_->max_count()); }
  /// The step the next call keys stochastic rounding with (each call adds one).
  std::int64_t step() const { return core_->step(); }
  /// Sets it (in [0, 2^32)); the next call enqueued uses it.
  void set_step(std::int64_t step) { set_step_of(*core_, step); }
  /// A copy of the per-rank feedback state (residual e, or EF21's g_i) of the first
  /// `count` elements, on the current stream; an empty tensor when the feedback has none.
  at::Tensor worker_state(std::int64_t count) const { return worker_state_of(*core_, count); }
  /// A copy of EF21's replicated g; empty for other feedback.
  at::Tensor replicated_state(std::int64_t count) const {
    return replicated_state_of(*core_, count);
  }
  /// Zeroes the feedback state (not stream-ordered: no call may be in flight).
  void reset_feedback() { core_->reset_feedback(); }
  /// Restores what worker_state(), replicated_state() and step() returned (a checkpoint):
  /// the states' first numel() elements (CUDA tensors of the state's dtype; empty where the
  /// feedback has none) and the step, copied on the current stream.
  void load_state(const at::Tensor& worker, const at::Tensor& replicated, std::int64_t step) {
    load_state_of(*core_, worker, replicated, step);
  }

 protected:
  explicit stateful_handle(std::unique_ptr<Core> core) : core_(std::move(core)) {}
  std::unique_ptr<Core> core_;
};

/// A lowbit::dynamic_all_reduce (widths 1, 2, 4, 8) for one tensor (a gradient bucket).
class all_reduce_handle : public stateful_handle<all_reduce_core> {
 public:
  all_reduce_handle(std::unique_ptr<all_reduce_core> core, at::ScalarType dtype,
                    backend_kind backend)
      : stateful_handle(std::move(core)), dtype_(dtype), backend_(backend) {}

  /// Enqueues out = all-reduce(in) at `bits` on the current stream (in == out allowed).
  void run(const at::Tensor& in, const at::Tensor& out, int bits);
  /// Measures the crossover at `bits` on this communicator (collective, synchronising:
  /// every rank calls it at the same point), sets it, and returns it in bytes.
  std::int64_t calibrate(int bits, std::int64_t max_bytes);
  std::int64_t crossover_bytes() const;
  void set_crossover_bytes(std::int64_t bytes);
  at::ScalarType dtype() const { return dtype_; }
  std::string algorithm() const { return core_->algorithm(); }
  /// The cudaStream_t (as an integer) the last run() was enqueued on; 0 before any.
  std::int64_t last_stream() const { return last_stream_; }
  /// "nccl" or "node".
  std::string backend() const { return backend_name(backend_); }
  /// [begin, end) of the values of a count-value call at `bits` this rank reduces and
  /// re-encodes under two_phase: what the second-stage residual's elements stand for.
  std::pair<std::int64_t, std::int64_t> reduced_shard(std::int64_t count, int bits) const;
  /// A copy of the second-stage residual (a rule with a second stage, under two_phase), all
  /// the elements the collective keeps (element i: value reduced_shard().first + i), on
  /// the current stream; an empty tensor when there is none.
  at::Tensor stage2_state() const;
  /// Copies `t` (what stage2_state() returned, or its first values) back, on the current
  /// stream; `t` must be empty exactly when there is no second-stage residual.
  void load_stage2_state(const at::Tensor& t);

 private:
  at::ScalarType dtype_;
  backend_kind backend_;
  std::int64_t last_stream_ = 0;
};

/// A lowbit::reduce_scatter or all_gather at one codec, for FSDP2's flat buffers. A
/// reduce_scatter built with the residual rule has worker state: the residual of every
/// value of the input (max_count, fp32), which FSDP's ReduceScatter saves and restores.
class shard_collective_handle : public stateful_handle<shard_collective_core> {
 public:
  shard_collective_handle(std::unique_ptr<shard_collective_core> core, at::ScalarType dtype,
                          bool gather)
      : stateful_handle(std::move(core)), dtype_(dtype), gather_(gather) {}

  /// reduce_scatter: in has count values, out gets this rank's shard; all_gather: in is
  /// this rank's shard, out gets count values. Enqueued on the current stream.
  void run(const at::Tensor& in, const at::Tensor& out);
  at::ScalarType dtype() const { return dtype_; }
  /// [begin, end) of this rank's shard of a count-value tensor.
  std::pair<std::int64_t, std::int64_t> shard(std::int64_t count) const;
  /// The cudaStream_t (as an integer) the last run() was enqueued on; 0 before any.
  std::int64_t last_stream() const { return last_stream_; }

 private:
  at::ScalarType dtype_;
  bool gather_;
  std::int64_t last_stream_ = 0;
};

std::unique_ptr<all_reduce_handle> make_all_reduce(const communicator& comm, at::ScalarType dtype,
                                                   std::int64_t max_count,
                                                   const codec_choice& codec,
                                                   feedback_kind feedback,
                                                   const collective_config& config);
std::unique_ptr<shard_collective_handle> make_reduce_scatter(
    const communicator& comm, at::ScalarType dtype, std::int64_t max_count,
    const codec_choice& codec, feedback_kind feedback, const collective_config& config);
std::unique_ptr<shard_collective_handle> make_all_gather(const communicator& comm,
                                                         at::ScalarType dtype,
                                                         std::int64_t max_count,
                                                         const codec_choice& codec,
                                                         const collective_config& config);

}  // namespace lowbit_torch
