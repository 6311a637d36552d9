// The collective handles (collectives.h): the tensor checks, torch's stream and the
// feedback state as tensors around the cores, and the run-time dispatch from Python's
// choices onto the compiled cores (instances.h). Host code: it instantiates no collective.
#include "collectives.h"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "choices.h"

namespace lowbit_torch {

namespace {

/// A copy of `count` elements of device state as a CUDA tensor (empty for none).
at::Tensor copy_state(const void* p, at::ScalarType dtype, std::int64_t count,
                      std::int64_t max_count) {
  TORCH_CHECK_VALUE(count >= 0 && count <= max_count, "lowbit_torch: state count ", count,
                    " is outside [0, ", max_count, "]");
  if (p == nullptr) return at::Tensor();
  at::Tensor t = at::empty({count}, at::TensorOptions(dtype).device(at::kCUDA));
  C10_CUDA_CHECK(cudaMemcpyAsync(t.data_ptr(), p, count * c10::elementSize(dtype),
                                 cudaMemcpyDeviceToDevice, current_stream()));
  return t;
}

/// Copies `t` (a checkpoint's copy of `count` elements of device state) back into `p`,
/// on the current stream; `t` must be empty exactly when there is no state (p null).
void restore_state(void* p, at::ScalarType dtype, const at::Tensor& t, std::int64_t max_count,
                   const char* what) {
  if (p == nullptr) {
    TORCH_CHECK_VALUE(!t.defined() || t.numel() == 0, "lowbit_torch: ", what,
                      ": this collective's feedback keeps no such state, but the checkpoint has ",
                      t.numel(), " values of it");
    return;
  }
  TORCH_CHECK_VALUE(t.defined(), "lowbit_torch: ", what, ": the checkpoint has no state");
  TORCH_CHECK_VALUE(t.is_cuda() && t.is_contiguous() && t.scalar_type() == dtype,
                    "lowbit_torch: ", what, ": the state must be a contiguous CUDA tensor of ",
                    dtype, ", got ", t.scalar_type(), " on ", t.device());
  TORCH_CHECK_VALUE(t.numel() <= max_count, "lowbit_torch: ", what, ": ", t.numel(),
                    " values is over the collective's max_count ", max_count);
  C10_CUDA_CHECK(cudaMemcpyAsync(p, t.data_ptr(), t.numel() * c10::elementSize(dtype),
                                 cudaMemcpyDeviceToDevice, current_stream()));
}

void check_count(std::int64_t n, std::int64_t max_count, const char* what) {
  TORCH_CHECK_VALUE(n <= max_count, what, ": ", n, " values is over the collective's max_count ",
                    max_count);
}

std::uint32_t checked_step(std::int64_t step, const char* what) {
  TORCH_CHECK_VALUE(step >= 0 && step <= std::int64_t{UINT32_MAX}, "lowbit_torch: ", what,
                    ": step ", step, " is outside [0, 2^32)");
  return static_cast<std::uint32_t>(step);
}

bool supported_bits(int bits) { return bits == 1 || bits == 2 || bits == 4 || bits == 8; }

}  // namespace

void all_reduce_handle::run(const at::Tensor& in, const at::Tensor& out, int bits) {
  constexpr const char* what = "lowbit_torch all_reduce";
  check_cuda_tensor(in, dtype_, what, "input");
  check_cuda_tensor(out, dtype_, what, "output");
  TORCH_CHECK_VALUE(in.numel() == out.numel(), what, ": input has ", in.numel(),
                    " values and output ", out.numel());
  check_count(in.numel(), max_count(), what);
  TORCH_CHECK_VALUE(supported_bits(bits), what, ": bits must be 1, 2, 4 or 8, got ", bits);
  const cudaStream_t stream = current_stream();
  last_stream_ = reinterpret_cast<std::int64_t>(stream);
  core_->run(in.data_ptr(), out.data_ptr(), static_cast<std::size_t>(in.numel()), bits, stream);
}

std::int64_t all_reduce_handle::calibrate(int bits, std::int64_t max_bytes) {
  TORCH_CHECK_VALUE(supported_bits(bits),
                    "lowbit_torch calibrate: bits must be 1, 2, 4 "
                    "or 8, got ",
                    bits);
  return static_cast<std::int64_t>(
      core_->calibrate(bits, static_cast<std::size_t>(max_bytes), current_stream()));
}

std::int64_t all_reduce_handle::crossover_bytes() const {
  return static_cast<std::int64_t>(core_->crossover_bytes());
}

void all_reduce_handle::set_crossover_bytes(std::int64_t bytes) {
  TORCH_CHECK_VALUE(bytes >= 0, "lowbit_torch: crossover must be >= 0 bytes, got ", bytes);
  core_->set_crossover_bytes(static_cast<std::size_t>(bytes));
}

std::pair<std::int64_t, std::int64_t> all_reduce_handle::reduced_shard(std::int64_t count,
                                                                       int bits) const {
  TORCH_CHECK_VALUE(supported_bits(bits),
                    "lowbit_torch reduced_shard: bits must be 1, 2, 4 or 8, got ", bits);
  TORCH_CHECK_VALUE(count >= 0 && count <= max_count(), "lowbit_torch reduced_shard: count ", count,
                    " is outside [0, ", max_count(), "]");
  const auto [begin, end] = core_->reduced_shard(static_cast<std::size_t>(count), bits);
  return {static_cast<std::int64_t>(begin), static_cast<std::int64_t>(end)};
}

at::Tensor all_reduce_handle::stage2_state() const {
  const feedback_arrays a = core_->feedback_state();
  const auto n = static_cast<std::int64_t>(a.stage2_count);
  return copy_state(a.stage2, scalar_type(a.stage2_dtype), n, n);
}

void all_reduce_handle::load_stage2_state(const at::Tensor& t) {
  const feedback_arrays a = core_->feedback_state();
  restore_state(a.stage2, scalar_type(a.stage2_dtype), t, static_cast<std::int64_t>(a.stage2_count),
                "second-stage residual");
}

at::Tensor worker_state_of(stateful_core& core, std::int64_t count) {
  const feedback_arrays a = core.feedback_state();
  return copy_state(a.worker, scalar_type(a.worker_dtype), count,
                    static_cast<std::int64_t>(core.max_count()));
}

at::Tensor replicated_state_of(stateful_core& core, std::int64_t count) {
  return copy_state(core.feedback_state().replicated, at::kFloat, count,
                    static_cast<std::int64_t>(core.max_count()));
}

void set_step_of(stateful_core& core, std::int64_t step) {
  core.set_step(checked_step(step, "set_step"));
}

void load_state_of(stateful_core& core, const at::Tensor& worker, const at::Tensor& replicated,
                   std::int64_t step) {
  const std::uint32_t s = checked_step(step, "load_state");  // before anything is copied
  const feedback_arrays a = core.feedback_state();
  const auto max_count = static_cast<std::int64_t>(core.max_count());
  restore_state(a.worker, scalar_type(a.worker_dtype), worker, max_count, "worker state");
  restore_state(a.replicated, at::kFloat, replicated, max_count, "replicated state");
  core.set_step(s);
}

void shard_collective_handle::run(const at::Tensor& in, const at::Tensor& out) {
  const char* what = gather_ ? "lowbit_torch all_gather" : "lowbit_torch reduce_scatter";
  check_cuda_tensor(in, dtype_, what, "input");
  check_cuda_tensor(out, dtype_, what, "output");
  const at::Tensor& whole = gather_ ? out : in;
  const at::Tensor& part = gather_ ? in : out;
  const std::int64_t count = whole.numel();
  check_count(count, max_count(), what);
  const auto [begin, end] = shard(count);
  TORCH_CHECK_VALUE(part.numel() == end - begin, what, ": this rank's shard of ", count,
                    " values has ", end - begin, " values, got a tensor of ", part.numel());
  const cudaStream_t stream = current_stream();
  last_stream_ = reinterpret_cast<std::int64_t>(stream);
  core_->run(in.data_ptr(), out.data_ptr(), static_cast<std::size_t>(count), stream);
}

std::pair<std::int64_t, std::int64_t> shard_collective_handle::shard(std::int64_t count) const {
  const auto [begin, end] = core_->shard(static_cast<std::size_t>(count));
  return {static_cast<std::int64_t>(begin), static_cast<std::int64_t>(end)};
}

std::unique_ptr<all_reduce_handle> make_all_reduce(const communicator& comm, at::ScalarType dtype,
                                                   std::int64_t max_count,
                                                   const codec_choice& codec,
                                                   feedback_kind feedback,
                                                   const collective_config& config) {
  check_max_count(max_count);
  std::unique_ptr<all_reduce_core> core;
  with_collective<all_reduce_instances>(
      "lowbit_torch all_reduce", comm.backend(), dtype, feedback, [&](auto b, auto t, auto f) {
        with_grid(codec, [&](auto g) {
          core = make_all_reduce_core<typename decltype(b)::type, typename decltype(t)::type,
                                      typename decltype(f)::type, typename decltype(g)::type>(
              comm, static_cast<std::size_t>(max_count), codec, config);
        });
      });
  return std::make_unique<all_reduce_handle>(std::move(core), dtype, comm.backend());
}

namespace {

/// What to do about a dtype the FSDP collectives are not compiled for.
constexpr const char* fsdp_dtype_hint =
    " (set MixedPrecisionPolicy(reduce_dtype=torch.float32 or torch.bfloat16))";

}  // namespace

std::unique_ptr<shard_collective_handle> make_reduce_scatter(
    const communicator& comm, at::ScalarType dtype, std::int64_t max_count,
    const codec_choice& codec, feedback_kind feedback, const collective_config& config) {
  check_max_count(max_count);
  std::unique_ptr<shard_collective_core> core;
  with_collective<reduce_scatter_instances>(
      "lowbit_torch reduce_scatter", comm.backend(), dtype, feedback,
      [&](auto b, auto t, auto f) {
        core = make_reduce_scatter_core<typename decltype(b)::type, typename decltype(t)::type,
                                        typename decltype(f)::type>(
            comm, static_cast<std::size_t>(max_count), codec, config);
      },
      fsdp_dtype_hint);
  return std::make_unique<shard_collective_handle>(std::move(core), dtype, false);
}

std::unique_ptr<shard_collective_handle> make_all_gather(const communicator& comm,
                                                         at::ScalarType dtype,
                                                         std::int64_t max_count,
                                                         const codec_choice& codec,
                                                         const collective_config& config) {
  check_max_count(max_count);
  std::unique_ptr<shard_collective_core> core;
  with_collective<all_gather_instances>(
      "lowbit_torch all_gather", comm.backend(), dtype,
      [&](auto b, auto t) {
        core = make_all_gather_core<typename decltype(b)::type, typename decltype(t)::type>(
            comm, static_cast<std::size_t>(max_count), codec, config);
      },
      fsdp_dtype_hint);
  return std::make_unique<shard_collective_handle>(std::move(core), dtype, true);
}

}  // namespace lowbit_torch
