// The collectives' cores (core.h) over lowbit's collectives on the NCCL or the node
// backend; included by the generated per-(backend, type, feedback) sources only. Without
// torch: the glue (collective_bindings.cpp) checks every argument before it comes here.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "core.h"
#include "lowbit/collective/nccl.cuh"
#include "lowbit/collective/node.cuh"

namespace lowbit_torch {

namespace detail {

/// dynamic_all_reduce seen at one width, as calibrate_crossover expects a collective.
template <class Dynamic>
struct at_width {
  using value_type = typename Dynamic::value_type;
  Dynamic& coll;
  int bits;
  std::size_t max_count() const { return coll.max_count(); }
  void set_crossover_bytes(std::size_t b) { coll.set_crossover_bytes(b); }
  void async(const value_type* in, value_type* out, std::size_t n, cudaStream_t s) {
    coll.async(in, out, n, bits, s);
  }
  std::uint32_t step() const { return coll.step(); }
  void set_step(std::uint32_t s) { coll.set_step(s); }
  void reset_feedback() { coll.reset_feedback(); }
};

/// The communicator wrapper of Backend (lowbit::comm::nccl_comm or node_comm).
template <class Backend>
using comm_of = typename lowbit::backend_impl<Backend>::comm_type;

/// The feedback state's arrays of a collective with feedback rule Feedback.
template <class Feedback, class State>
feedback_arrays arrays_of(State& state) {
  feedback_arrays a;
  a.replicated = state.replicated();
  if constexpr (Feedback::worker) {
    const auto ref = state.worker_ref();
    using R = typename Feedback::storage_type;
    if constexpr (Feedback::replicated) {
      a.worker = static_cast<R*>(ref.g);
    } else {
      a.worker = static_cast<R*>(ref.e);
    }
    a.worker_dtype = dtype_of<R>();
  }
  if constexpr (Feedback::stage2) {
    a.stage2 = state.stage2();
    a.stage2_dtype = dtype_of<typename Feedback::storage_type>();
    a.stage2_count = state.stage2_count();
  }
  return a;
}

}  // namespace detail

template <class Backend, class T, class Feedback, class Grid, class Rounding>
class all_reduce_impl final : public all_reduce_core {
  using coll_type = lowbit::dynamic_all_reduce<T, absmax_family<Grid, Rounding>::template of,
                                               lowbit::bit_widths<1, 2, 4, 8>, Feedback,
                                               lowbit::schedule::default_schedule, Backend>;
  /// Only the NCCL backend has a crossover (NCCL's own all-reduce below it); the node
  /// backend always runs the codec.
  static constexpr bool has_crossover = std::is_same_v<Backend, lowbit::backend::nccl>;

 public:
  all_reduce_impl(const communicator& comm, std::size_t max_count, const collective_config& config)
      : comm_(comm.shared(tag<detail::comm_of<Backend>>{})),
        coll_(*comm_, max_count, config.options()) {}

  void run(const void* in, void* out, std::size_t count, int bits, cudaStream_t stream) override {
    coll_.async(static_cast<const T*>(in), static_cast<T*>(out), count, bits, stream);
  }
  std::size_t calibrate(int bits, std::size_t max_bytes, cudaStream_t stream) override {
    if constexpr (has_crossover) {
      detail::at_width<coll_type> view{coll_, bits};
      return lowbit::calibrate_crossover(view, *comm_, stream, max_bytes);
    } else {
      (void)bits, (void)max_bytes, (void)stream;
      return 0;  // no crossover: every call runs the codec
    }
  }
  std::size_t crossover_bytes() const override {
    if constexpr (!has_crossover) return 0;
    return coll_.crossover_bytes();
  }
  void set_crossover_bytes(std::size_t bytes) override {
    if constexpr (has_crossover) coll_.set_crossover_bytes(bytes);
  }
  std::size_t max_count() const override { return coll_.max_count(); }
  std::uint32_t step() const override { return coll_.step(); }
  void set_step(std::uint32_t step) override { coll_.set_step(step); }
  std::string algorithm() const override { return lowbit::to_string(coll_.algorithm()); }
  std::pair<std::size_t, std::size_t> reduced_shard(std::size_t count, int bits) const override {
    const auto r = coll_.reduced_shard(count, bits);
    return {r.begin, r.end()};
  }
  feedback_arrays feedback_state() override {
    return detail::arrays_of<Feedback>(coll_.feedback_state());
  }
  void reset_feedback() override { coll_.reset_feedback(); }

 private:
  std::shared_ptr<detail::comm_of<Backend>> comm_;  // before coll_: it outlives it
  coll_type coll_;
};

template <class Backend, class T, class Feedback, class Grid>
std::unique_ptr<all_reduce_core> make_all_reduce_core(const communicator& comm,
                                                      std::size_t max_count,
                                                      const codec_choice& codec,
                                                      const collective_config& config) {
  return with_rounding(codec, [&](auto r) -> std::unique_ptr<all_reduce_core> {
    return std::make_unique<
        all_reduce_impl<Backend, T, Feedback, Grid, typename decltype(r)::type>>(comm, max_count,
                                                                                 config);
  });
}

/// reduce_scatter (Gather = false) or all_gather (true) at one codec.
template <class Backend, class T, class Codec, class Feedback, bool Gather>
class shard_collective_impl final : public shard_collective_core {
  using coll_type = std::conditional_t<
      Gather, lowbit::all_gather<T, Codec, lowbit::schedule::default_schedule, Backend>,
      lowbit::reduce_scatter<T, Codec, Feedback, lowbit::schedule::default_schedule, Backend>>;

 public:
  shard_collective_impl(const communicator& comm, std::size_t max_count,
                        const collective_config& config)
      : comm_(comm.shared(tag<detail::comm_of<Backend>>{})),
        coll_(*comm_, max_count, config.options()) {}

  void run(const void* in, void* out, std::size_t count, cudaStream_t stream) override {
    coll_.async(static_cast<const T*>(in), static_cast<T*>(out), count, stream);
  }
  std::size_t max_count() const override { return coll_.max_count(); }
  std::pair<std::size_t, std::size_t> shard(std::size_t count) const override {
    const auto s = coll_.shard(count);
    return {s.begin, s.end()};
  }
  std::uint32_t step() const override { return coll_.step(); }
  void set_step(std::uint32_t step) override { coll_.set_step(step); }
  feedback_arrays feedback_state() override {
    if constexpr (Gather) {
      return {};  // lowbit::all_gather keeps no feedback state
    } else {
      return detail::arrays_of<Feedback>(coll_.feedback_state());
    }
  }
  void reset_feedback() override { coll_.reset_feedback(); }

 private:
  std::shared_ptr<detail::comm_of<Backend>> comm_;  // before coll_: it outlives it
  coll_type coll_;
};

/// A shard collective at the choice's codec.
template <class Backend, class T, class Feedback, bool Gather>
std::unique_ptr<shard_collective_core> make_shard_collective_core(const communicator& comm,
                                                                  std::size_t max_count,
                                                                  const codec_choice& codec,
                                                                  const collective_config& config) {
  return with_codec(codec, [&](auto c) -> std::unique_ptr<shard_collective_core> {
    return std::make_unique<
        shard_collective_impl<Backend, T, typename decltype(c)::type, Feedback, Gather>>(
        comm, max_count, config);
  });
}

template <class Backend, class T, class Feedback>
std::unique_ptr<shard_collective_core> make_reduce_scatter_core(const communicator& comm,
                                                                std::size_t max_count,
                                                                const codec_choice& codec,
                                                                const collective_config& config) {
  return make_shard_collective_core<Backend, T, Feedback, false>(comm, max_count, codec, config);
}

template <class Backend, class T>
std::unique_ptr<shard_collective_core> make_all_gather_core(const communicator& comm,
                                                            std::size_t max_count,
                                                            const codec_choice& codec,
                                                            const collective_config& config) {
  return make_shard_collective_core<Backend, T, lowbit::feedback::none, true>(comm, max_count,
                                                                              codec, config);
}

}  // namespace lowbit_torch
