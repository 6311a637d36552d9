// What every source of the extension shares: the codec menu compiled in, the run-time
// dispatch from Python's codec choice onto lowbit's template arguments, and tensor checks
// that raise Python exceptions (ValueError / TypeError / RuntimeError) naming the
// argument. The element types and feedback rules compiled are in the generated
// instances.h.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/extension.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "lowbit/codec/absmax.hpp"
#include "lowbit/codec/codec.hpp"
#include "lowbit/comm/nccl_comm.hpp"
#include "lowbit/comm/node_comm.hpp"
#include "lowbit/feedback/state.hpp"

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

/// A codec chosen at run time: width, grid and rounding.
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
  TORCH_CHECK_VALUE(false, "lowbit_torch: bits must be 1, 2, 4 or 8, got ", bits);
}

/// Calls f(tag<Grid>{}, tag<Rounding>{}) for the choice's grid and rounding.
template <class F>
decltype(auto) with_grid_rounding(const codec_choice& c, F&& f) {
  using namespace lowbit;
  if (c.zero_grid) {
    if (c.stochastic) return f(tag<quant::grid::zero>{}, tag<round::stochastic>{});
    return f(tag<quant::grid::zero>{}, tag<round::nearest>{});
  }
  if (c.stochastic) return f(tag<quant::grid::full>{}, tag<round::stochastic>{});
  return f(tag<quant::grid::full>{}, tag<round::nearest>{});
}

/// Calls f(tag<Codec>{}) for the choice.
template <class F>
decltype(auto) with_codec(const codec_choice& c, F&& f) {
  return with_grid_rounding(c, [&](auto g, auto r) -> decltype(auto) {
    using family = absmax_family<typename decltype(g)::type, typename decltype(r)::type>;
    return with_bits(c.bits, [&](auto b) -> decltype(auto) {
      return f(tag<typename family::template of<decltype(b)::value>>{});
    });
  });
}

/// The torch dtype of T.
template <class T>
at::ScalarType scalar_type_of() {
  if constexpr (std::is_same_v<T, float>) return at::kFloat;
  if constexpr (std::is_same_v<T, __half>) return at::kHalf;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return at::kBFloat16;
}

/// A dense CUDA tensor on the current device, of dtype T.
template <class T>
void check_cuda_tensor(const at::Tensor& t, const char* what, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), what, ": ", name, " is undefined");
  TORCH_CHECK_VALUE(t.is_cuda(), what, ": ", name, " must be a CUDA tensor, got ", t.device());
  TORCH_CHECK_VALUE(t.is_contiguous(), what, ": ", name, " must be contiguous");
  TORCH_CHECK_TYPE(t.scalar_type() == scalar_type_of<T>(), what, ": ", name, " has dtype ",
                   t.scalar_type(), " where ", scalar_type_of<T>(), " was expected");
  TORCH_CHECK_VALUE(t.get_device() == c10::cuda::current_device(), what, ": ", name,
                    " is on cuda:", t.get_device(),
                    " but the current device is cuda:", c10::cuda::current_device());
}

/// Raw pointer to a tensor's data as T.
template <class T>
T* data_as(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
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
  /// The NCCL communicator at `handle` (ProcessGroupNCCL's _comm_ptr()).
  explicit communicator(std::int64_t handle) : backend_(backend_kind::nccl) {
    TORCH_CHECK_VALUE(handle != 0,
                      "lowbit_torch: the process group has no NCCL communicator yet (create it "
                      "eagerly with init_process_group(..., device_id=...) or run one collective "
                      "first)");
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
    TORCH_CHECK(nccl_ != nullptr, "lowbit_torch: this communicator is not NCCL's");
    return nccl_;
  }
  std::shared_ptr<lowbit::comm::node_comm> shared(tag<lowbit::comm::node_comm>) const {
    TORCH_CHECK(node_ != nullptr, "lowbit_torch: this communicator is not the node backend's");
    return node_;
  }
  int rank() const { return nccl_ ? nccl_->rank() : node_->rank(); }
  int size() const { return nccl_ ? nccl_->size() : node_->size(); }

 private:
  backend_kind backend_;
  std::shared_ptr<lowbit::comm::nccl_comm> nccl_;
  std::shared_ptr<lowbit::comm::node_comm> node_;
};

/// torch's current stream on the current device: lowbit's work is ordered with the
/// training step's own kernels there.
inline cudaStream_t current_stream() { return at::cuda::getCurrentCUDAStream().stream(); }

}  // namespace lowbit_torch
