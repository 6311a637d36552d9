// The handles' implementations over lowbit's collectives on the NCCL or the node backend;
// included by the generated per-(backend, type, feedback) sources only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "collectives.h"
#include "lowbit/collective/nccl.cuh"
#include "lowbit/collective/node.cuh"

namespace lowbit_torch {

namespace detail {

/// A copy of `count` elements of device state as a CUDA tensor (empty for none).
template <class R>
at::Tensor copy_state(const R* p, std::int64_t count, std::int64_t max_count) {
  TORCH_CHECK_VALUE(count >= 0 && count <= max_count, "lowbit_torch: state count ", count,
                    " is outside [0, ", max_count, "]");
  if (p == nullptr) return at::Tensor();
  at::Tensor t = at::empty({count}, at::TensorOptions(scalar_type_of<R>()).device(at::kCUDA));
  C10_CUDA_CHECK(cudaMemcpyAsync(t.data_ptr(), p, count * sizeof(R), cudaMemcpyDeviceToDevice,
                                 current_stream()));
  return t;
}

/// Copies `t` (a checkpoint's copy of `count` elements of device state) back into `p`,
/// on the current stream; `t` must be empty exactly when there is no state (p null).
template <class R>
void load_state(R* p, const at::Tensor& t, std::int64_t max_count, const char* what) {
  if (p == nullptr) {
    TORCH_CHECK_VALUE(!t.defined() || t.numel() == 0, "lowbit_torch: ", what,
                      ": this collective's feedback keeps no such state, but the checkpoint has ",
                      t.numel(), " values of it");
    return;
  }
  TORCH_CHECK_VALUE(t.defined(), "lowbit_torch: ", what, ": the checkpoint has no state");
  TORCH_CHECK_VALUE(t.is_cuda() && t.is_contiguous() && t.scalar_type() == scalar_type_of<R>(),
                    "lowbit_torch: ", what, ": the state must be a contiguous CUDA tensor of ",
                    scalar_type_of<R>(), ", got ", t.scalar_type(), " on ", t.device());
  TORCH_CHECK_VALUE(t.numel() <= max_count, "lowbit_torch: ", what, ": ", t.numel(),
                    " values is over the collective's max_count ", max_count);
  C10_CUDA_CHECK(cudaMemcpyAsync(p, t.data_ptr(), t.numel() * sizeof(R), cudaMemcpyDeviceToDevice,
                                 current_stream()));
}

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

inline void check_count(std::int64_t n, std::int64_t max_count, const char* what) {
  TORCH_CHECK_VALUE(n <= max_count, what, ": ", n, " values is over the collective's max_count ",
                    max_count);
}

}  // namespace detail

template <class Backend, class T, class Feedback, class Grid, class Rounding>
class all_reduce_impl final : public all_reduce_handle {
  using coll_type = lowbit::dynamic_all_reduce<T, absmax_family<Grid, Rounding>::template of,
                                               lowbit::bit_widths<1, 2, 4, 8>, Feedback,
                                               lowbit::schedule::default_schedule, Backend>;
  /// Only the NCCL backend has a crossover (NCCL's own all-reduce below it); the node
  /// backend always runs the codec.
  static constexpr bool has_crossover = std::is_same_v<Backend, lowbit::backend::nccl>;

 public:
  all_reduce_impl(const communicator& comm, std::int64_t max_count, const collective_config& config)
      : comm_(comm.shared(tag<detail::comm_of<Backend>>{})),
        coll_(*comm_, static_cast<std::size_t>(max_count), config.options()) {}

  void run(const at::Tensor& in, const at::Tensor& out, int bits) override {
    constexpr const char* what = "lowbit_torch all_reduce";
    check_cuda_tensor<T>(in, what, "input");
    check_cuda_tensor<T>(out, what, "output");
    TORCH_CHECK_VALUE(in.numel() == out.numel(), what, ": input has ", in.numel(),
                      " values and output ", out.numel());
    detail::check_count(in.numel(), max_count(), what);
    TORCH_CHECK_VALUE(coll_type::supports(bits), what, ": bits must be 1, 2, 4 or 8, got ", bits);
    const cudaStream_t stream = current_stream();
    last_stream_ = reinterpret_cast<std::int64_t>(stream);
    coll_.async(data_as<const T>(in), data_as<T>(out), static_cast<std::size_t>(in.numel()), bits,
                stream);
  }
  std::int64_t calibrate(int bits, std::int64_t max_bytes) override {
    TORCH_CHECK_VALUE(coll_type::supports(bits),
                      "lowbit_torch calibrate: bits must be 1, 2, 4 "
                      "or 8, got ",
                      bits);
    if constexpr (has_crossover) {
      detail::at_width<coll_type> view{coll_, bits};
      return static_cast<std::int64_t>(lowbit::calibrate_crossover(
          view, *comm_, current_stream(), static_cast<std::size_t>(max_bytes)));
    } else {
      (void)max_bytes;
      return 0;  // no crossover: every call runs the codec
    }
  }
  std::int64_t crossover_bytes() const override {
    if constexpr (!has_crossover) return 0;
    return static_cast<std::int64_t>(coll_.crossover_bytes());
  }
  void set_crossover_bytes(std::int64_t bytes) override {
    TORCH_CHECK_VALUE(bytes >= 0, "lowbit_torch: crossover must be >= 0 bytes, got ", bytes);
    if constexpr (has_crossover) coll_.set_crossover_bytes(static_cast<std::size_t>(bytes));
  }
  std::int64_t last_stream() const override { return last_stream_; }
  std::string backend() const override { return has_crossover ? "nccl" : "node"; }
  std::int64_t max_count() const override { return static_cast<std::int64_t>(coll_.max_count()); }
  std::int64_t step() const override { return coll_.step(); }
  at::ScalarType dtype() const override { return scalar_type_of<T>(); }
  std::string algorithm() const override { return lowbit::to_string(coll_.algorithm()); }
  at::Tensor worker_state(std::int64_t count) const override {
    const auto ref = const_cast<coll_type&>(coll_).feedback_state().worker_ref();
    if constexpr (!Feedback::worker) {
      return detail::copy_state<float>(nullptr, count, max_count());
    } else if constexpr (Feedback::replicated) {
      return detail::copy_state(ref.g, count, max_count());
    } else {
      return detail::copy_state(ref.e, count, max_count());
    }
  }
  at::Tensor replicated_state(std::int64_t count) const override {
    return detail::copy_state<float>(const_cast<coll_type&>(coll_).feedback_state().replicated(),
                                     count, max_count());
  }
  void reset_feedback() override { coll_.reset_feedback(); }
  void load_state(const at::Tensor& worker, const at::Tensor& replicated,
                  std::int64_t step) override {
    TORCH_CHECK_VALUE(step >= 0 && step <= std::int64_t{UINT32_MAX},
                      "lowbit_torch: load_state: step ", step, " is outside [0, 2^32)");
    auto& state = coll_.feedback_state();
    const auto ref = state.worker_ref();
    if constexpr (!Feedback::worker)
      detail::load_state<float>(nullptr, worker, max_count(), "worker state");
    else if constexpr (Feedback::replicated)
      detail::load_state(ref.g, worker, max_count(), "worker state");
    else
      detail::load_state(ref.e, worker, max_count(), "worker state");
    detail::load_state(state.replicated(), replicated, max_count(), "replicated state");
    coll_.set_step(static_cast<std::uint32_t>(step));
  }

 private:
  std::shared_ptr<detail::comm_of<Backend>> comm_;  // before coll_: it outlives it
  coll_type coll_;
  std::int64_t last_stream_ = 0;
};

template <class Backend, class T, class Feedback>
std::unique_ptr<all_reduce_handle> make_all_reduce_as(const communicator& comm,
                                                      std::int64_t max_count,
                                                      const codec_choice& codec,
                                                      const collective_config& config) {
  return with_grid_rounding(codec, [&](auto g, auto r) -> std::unique_ptr<all_reduce_handle> {
    return std::make_unique<all_reduce_impl<Backend, T, Feedback, typename decltype(g)::type,
                                            typename decltype(r)::type>>(comm, max_count, config);
  });
}

/// reduce_scatter (Gather = false) or all_gather (true) at one codec.
template <class Backend, class T, class Codec, class Feedback, bool Gather>
class shard_collective_impl final : public shard_collective_handle {
  using coll_type = std::conditional_t<
      Gather, lowbit::all_gather<T, Codec, lowbit::schedule::default_schedule, Backend>,
      lowbit::reduce_scatter<T, Codec, Feedback, lowbit::schedule::default_schedule, Backend>>;

 public:
  shard_collective_impl(const communicator& comm, std::int64_t max_count,
                        const collective_config& config)
      : comm_(comm.shared(tag<detail::comm_of<Backend>>{})),
        coll_(*comm_, static_cast<std::size_t>(max_count), config.options()) {}

  void run(const at::Tensor& in, const at::Tensor& out) override {
    constexpr const char* what = Gather ? "lowbit_torch all_gather" : "lowbit_torch reduce_scatter";
    check_cuda_tensor<T>(in, what, "input");
    check_cuda_tensor<T>(out, what, "output");
    const at::Tensor& whole = Gather ? out : in;
    const at::Tensor& part = Gather ? in : out;
    const std::int64_t count = whole.numel();
    detail::check_count(count, max_count(), what);
    const auto [begin, end] = shard(count);
    TORCH_CHECK_VALUE(part.numel() == end - begin, what, ": this rank's shard of ", count,
                      " values has ", end - begin, " values, got a tensor of ", part.numel());
    const cudaStream_t stream = current_stream();
    last_stream_ = reinterpret_cast<std::int64_t>(stream);
    coll_.async(data_as<const T>(in), data_as<T>(out), static_cast<std::size_t>(count), stream);
  }
  std::int64_t last_stream() const override { return last_stream_; }
  std::int64_t max_count() const override { return static_cast<std::int64_t>(coll_.max_count()); }
  at::ScalarType dtype() const override { return scalar_type_of<T>(); }
  std::pair<std::int64_t, std::int64_t> shard(std::int64_t count) const override {
    const auto s = coll_.shard(static_cast<std::size_t>(count));
    return {static_cast<std::int64_t>(s.begin), static_cast<std::int64_t>(s.end())};
  }

 private:
  std::shared_ptr<detail::comm_of<Backend>> comm_;  // before coll_: it outlives it
  coll_type coll_;
  std::int64_t last_stream_ = 0;
};

template <class Backend, class T, class Feedback>
std::unique_ptr<shard_collective_handle> make_reduce_scatter_as(const communicator& comm,
                                                                std::int64_t max_count,
                                                                const codec_choice& codec,
                                                                const collective_config& config) {
  return with_codec(codec, [&](auto c) -> std::unique_ptr<shard_collective_handle> {
    return std::make_unique<
        shard_collective_impl<Backend, T, typename decltype(c)::type, Feedback, false>>(
        comm, max_count, config);
  });
}

template <class Backend, class T>
std::unique_ptr<shard_collective_handle> make_all_gather_as(const communicator& comm,
                                                            std::int64_t max_count,
                                                            const codec_choice& codec,
                                                            const collective_config& config) {
  return with_codec(codec, [&](auto c) -> std::unique_ptr<shard_collective_handle> {
    return std::make_unique<shard_collective_impl<Backend, T, typename decltype(c)::type,
                                                  lowbit::feedback::none, true>>(comm, max_count,
                                                                                 config);
  });
}

}  // namespace lowbit_torch
