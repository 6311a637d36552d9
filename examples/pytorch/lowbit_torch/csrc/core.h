// What the compiled instances and the torch glue share, without torch: the codec menu and
// the run-time dispatch from a codec choice onto lowbit's template arguments, the element
// types, the communicator, and the type-erased cores of the collectives and the codec
// (raw device pointers, counts, cudaStream_t). The generated per-instance sources include
// this header and lowbit's, never torch's (torch's headers would cost each of them most of
// its compile time); the bindings wrap the cores in tensor checks (common.h, collectives.h).
// The element types and feedback rules compiled are in the generated instances.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "lowbit/codec/absmax.hpp"
#include "lowbit/codec/codec.hpp"
#include "lowbit/collective/types.hpp"
#include "lowbit/comm/nccl_comm.hpp"
#include "lowbit/comm/node_comm.hpp"
#include "lowbit/core/error.hpp"

namespace lowbit_torch {

/// Values per codec block (lowbit_torch.codec.BLOCK): the compiled codecs' block size.
inline constexpr int codec_block = 128;

/// The absmax codecs the extension compiles: blocks of codec_block values, either grid,
/// either rounding.
template <class Grid, class Rounding>
struct absmax_family {
  template <int Bits>
  using of = lowbit::codec<lowbit::quant::absmax<Bits, codec_block, Grid>, Rounding>;
};

/// A codec chosen at run time: width, grid and rounding (checked by choices.h's make_codec).
struct codec_choice {
  int bits = 4;
  bool zero_grid = true;
  bool stochastic = false;
};

template <class T>
struct tag {
  using type = T;
};
template <int B>
using bits_c = std::integral_constant<int, B>;

/// Calls f(bits_c<b>{}) for the run-time width b among 1, 2, 4, 8.
template <class F>
decltype(auto) with_bits(int bits, F&& f) {
  switch (bits) {
    case 1:
      return f(bits_c<1>{});
    case 2:
      return f(bits_c<2>{});
    case 4:
      return f(bits_c<4>{});
    case 8:
      return f(bits_c<8>{});
  }
  LOWBIT_EXPECTS(false, "lowbit_torch: bits must be 1, 2, 4 or 8, got " + std::to_string(bits));
}

/// Calls f(tag<Grid>{}) for the choice's grid.
template <class F>
decltype(auto) with_grid(const codec_choice& c, F&& f) {
  if (c.zero_grid) return f(tag<lowbit::quant::grid::zero>{});
  return f(tag<lowbit::quant::grid::full>{});
}

/// Calls f(tag<Rounding>{}) for the choice's rounding.
template <class F>
decltype(auto) with_rounding(const codec_choice& c, F&& f) {
  if (c.stochastic) return f(tag<lowbit::round::stochastic>{});
  return f(tag<lowbit::round::nearest>{});
}

/// Calls f(tag<Grid>{}, tag<Rounding>{}) for the choice's grid and rounding.
template <class F>
decltype(auto) with_grid_rounding(const codec_choice& c, F&& f) {
  return with_grid(c, [&](auto g) -> decltype(auto) {
    return with_rounding(c, [&](auto r) -> decltype(auto) { return f(g, r); });
  });
}

/// Calls f(tag<Codec>{}) for the choice's width at Grid and Rounding.
template <class Grid, class Rounding, class F>
decltype(auto) with_codec_at(int bits, F&& f) {
  return with_bits(bits, [&](auto b) -> decltype(auto) {
    return f(tag<typename absmax_family<Grid, Rounding>::template of<decltype(b)::value>>{});
  });
}

/// Calls f(tag<Codec>{}) for the choice.
template <class F>
decltype(auto) with_codec(const codec_choice& c, F&& f) {
  return with_grid_rounding(c, [&](auto g, auto r) -> decltype(auto) {
    return with_codec_at<typename decltype(g)::type, typename decltype(r)::type>(c.bits, f);
  });
}

/// The element types (lowbit_torch/_build.py's DTYPES, in the same order), as the cores
/// name them to the glue (common.h's scalar_type maps them onto torch's).
enum class dtype_kind { float32, float16, bfloat16 };

/// The dtype_kind of T.
template <class T>
constexpr dtype_kind dtype_of() {
  static_assert(
      std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
      "lowbit_torch: no dtype_kind for this element type");
  if constexpr (std::is_same_v<T, float>) return dtype_kind::float32;
  if constexpr (std::is_same_v<T, __half>) return dtype_kind::float16;
  return dtype_kind::bfloat16;
}

/// The collectives' backends (lowbit_torch/_build.py's BACKENDS: the same names, in the
/// same order): an NCCL process group's communicator, or the node backend's.
enum class backend_kind { nccl, node };

inline const char* backend_name(backend_kind b) {
  return b == backend_kind::nccl ? "nccl" : "node";
}

/// What every collective the extension builds runs on: the process group's NCCL
/// communicator, borrowed (torch owns and destroys it), or a lowbit::comm::node_comm of
/// the group's ranks on one node (bootstrapped over the group's Store by the Python side;
/// several ranks may share one GPU). Shared by every collective built on it, which keep a
/// reference to it.
class communicator {
 public:
  /// The NCCL communicator at `handle` (ProcessGroupNCCL's _comm_ptr(), not 0: the
  /// binding checks it).
  explicit communicator(std::int64_t handle) : backend_(backend_kind::nccl) {
    nccl_ = std::make_shared<lowbit::comm::nccl_comm>(reinterpret_cast<ncclComm_t>(handle));
  }
  /// A node communicator of `size` ranks on the current CUDA device (collective over
  /// `bootstrap`, which every collective built on it calls again while it is built).
  communicator(int rank, int size, lowbit::comm::bootstrap_allgather bootstrap)
      : backend_(backend_kind::node) {
    node_ = std::make_shared<lowbit::comm::node_comm>(rank, size, std::move(bootstrap));
  }

  backend_kind backend() const { return backend_; }
  /// The wrapper, shared: a collective holds a reference to keep it alive.
  std::shared_ptr<lowbit::comm::nccl_comm> shared(tag<lowbit::comm::nccl_comm>) const {
    if (nccl_ == nullptr) throw std::runtime_error("lowbit_torch: this communicator is not NCCL's");
    return nccl_;
  }
  std::shared_ptr<lowbit::comm::node_comm> shared(tag<lowbit::comm::node_comm>) const {
    if (node_ == nullptr) {
      throw std::runtime_error("lowbit_torch: this communicator is not the node backend's");
    }
    return node_;
  }
  int rank() const { return nccl_ ? nccl_->rank() : node_->rank(); }
  int size() const { return nccl_ ? nccl_->size() : node_->size(); }

 private:
  backend_kind backend_;
  std::shared_ptr<lowbit::comm::nccl_comm> nccl_;
  std::shared_ptr<lowbit::comm::node_comm> node_;
};

/// What a Python caller configures on a collective besides codec and feedback (checked by
/// choices.h's make_config).
struct collective_config {
  bool average = true;         ///< avg (x 1/P when decoding) or sum
  std::uint64_t seed = 0;      ///< stochastic rounding's seed
  std::int64_t crossover = 0;  ///< bytes below which the plain NCCL collective runs (NCCL only)
  std::string algorithm = "automatic";

  lowbit::collective_options options() const {
    lowbit::collective_options o;
    o.op = average ? lowbit::reduce_op::avg : lowbit::reduce_op::sum;
    o.seed = seed;
    o.crossover_bytes = static_cast<std::size_t>(crossover);
    o.algorithm = algorithm == "one_shot"    ? lowbit::all_reduce_algorithm::one_shot
                  : algorithm == "two_phase" ? lowbit::all_reduce_algorithm::two_phase
                                             : lowbit::all_reduce_algorithm::automatic;
    return o;
  }
};

/// A feedback state's device arrays: the per-rank one (residual e, or EF21's g_i; null
/// when the rule keeps none) of `worker_dtype`, EF21's replicated g (null for others), and
/// the second-stage residual of this rank's reduced shard (`stage2_count` values of
/// `stage2_dtype`; null unless the rule keeps one and the collective re-encodes).
struct feedback_arrays {
  void* worker = nullptr;
  dtype_kind worker_dtype = dtype_kind::float32;
  float* replicated = nullptr;
  void* stage2 = nullptr;
  dtype_kind stage2_dtype = dtype_kind::float32;
  std::size_t stage2_count = 0;
};

/// What every collective core has besides its call: the step the next call keys
/// stochastic rounding with (each call adds one) and the feedback state (its arrays; none
/// for a rule that keeps none), which the glue copies out for a checkpoint and back on a
/// resume (collectives.h's stateful_handle).
class stateful_core {
 public:
  virtual ~stateful_core() = default;
  virtual std::size_t max_count() const = 0;
  virtual std::uint32_t step() const = 0;
  virtual void set_step(std::uint32_t step) = 0;
  virtual feedback_arrays feedback_state() = 0;
  /// Zeroes the feedback state (not stream-ordered: no call may be in flight).
  virtual void reset_feedback() = 0;
};

/// A lowbit::dynamic_all_reduce (widths 1, 2, 4, 8) at one element type, feedback rule,
/// grid and rounding, on one backend. Arguments are checked by the glue
/// (collective_bindings.cpp's all_reduce_handle) before they come here.
class all_reduce_core : public stateful_core {
 public:
  /// Enqueues out = all-reduce(in) of `count` values at `bits` on `stream`.
  virtual void run(const void* in, void* out, std::size_t count, int bits, cudaStream_t stream) = 0;
  /// Measures the crossover at `bits` (collective, synchronising), sets it, returns it in
  /// bytes; 0 on a backend without one (node).
  virtual std::size_t calibrate(int bits, std::size_t max_bytes, cudaStream_t stream) = 0;
  /// 0 on a backend without a crossover, whose setter does nothing.
  virtual std::size_t crossover_bytes() const = 0;
  virtual void set_crossover_bytes(std::size_t bytes) = 0;
  virtual std::string algorithm() const = 0;
  /// [begin, end) of the values of a `count`-value call at `bits` this rank reduces under
  /// two_phase: where the second-stage residual lies (feedback_arrays::stage2, from
  /// value begin).
  virtual std::pair<std::size_t, std::size_t> reduced_shard(std::size_t count, int bits) const = 0;
};

/// A lowbit::reduce_scatter or all_gather at one codec, checked by the glue as above. A
/// reduce_scatter with the residual rule keeps the residual of every value it encodes
/// (max_count of them, fp32): its feedback_state()'s worker array; an all_gather keeps
/// none.
class shard_collective_core : public stateful_core {
 public:
  /// reduce_scatter: in has count values, out gets this rank's shard; all_gather: in is
  /// this rank's shard, out gets count values. Enqueued on `stream`.
  virtual void run(const void* in, void* out, std::size_t count, cudaStream_t stream) = 0;
  /// [begin, end) of this rank's shard of a count-value tensor.
  virtual std::pair<std::size_t, std::size_t> shard(std::size_t count) const = 0;
};

/// The factories per (backend tag, element type, feedback) at one grid (the rounding is
/// the choice's), each instantiated in a generated source of its own: they compile in
/// parallel. The codec choice's grid is Grid's.
template <class Backend, class T, class Feedback, class Grid>
std::unique_ptr<all_reduce_core> make_all_reduce_core(const communicator& comm,
                                                      std::size_t max_count,
                                                      const codec_choice& codec,
                                                      const collective_config& config);
template <class Backend, class T, class Feedback>
std::unique_ptr<shard_collective_core> make_reduce_scatter_core(const communicator& comm,
                                                                std::size_t max_count,
                                                                const codec_choice& codec,
                                                                const collective_config& config);
template <class Backend, class T>
std::unique_ptr<shard_collective_core> make_all_gather_core(const communicator& comm,
                                                            std::size_t max_count,
                                                            const codec_choice& codec,
                                                            const collective_config& config);

/// Key of stochastic rounding: what the collectives use for (seed, step, rank).
struct rounding_key {
  std::uint64_t seed = 0;
  std::uint32_t step = 0;
  std::uint32_t rank = 0;
};

/// The codec at one element type (instantiated once per type, in the generated
/// codec_<dtype>.cu): `count` values at `x` into the frame at `frame` (frame_bytes of
/// them), and back scaled by `scale`; on the device (enqueued on `stream`) or on the
/// host. Decoding takes no rounding.
template <class T>
struct codec_core {
  static void encode_device(const T* x, std::size_t count, std::byte* frame, const codec_choice& c,
                            const rounding_key& k, cudaStream_t stream);
  static void encode_host(const T* x, std::size_t count, std::byte* frame, std::size_t frame_bytes,
                          const codec_choice& c, const rounding_key& k);
  static void decode_device(const std::byte* frame, std::size_t count, T* out,
                            const codec_choice& c, float scale, cudaStream_t stream);
  static void decode_host(const std::byte* frame, std::size_t frame_bytes, std::size_t count,
                          T* out, const codec_choice& c, float scale);
};

}  // namespace lowbit_torch
