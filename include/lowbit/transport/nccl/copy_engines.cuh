// frame_transport::copy_engines: all-gathers that take no SM. NCCL (2.28 and later) runs
// a collective without CTAs where it can on a communicator whose config.CTAPolicy is
// NCCL_CTA_POLICY_ZERO; on one node, an all-gather between buffers of a symmetric window
// registered with such a communicator is carried out by the GPUs' copy engines instead of
// an NCCL kernel, so it takes no SM from the codec kernels that run beside it. A
// copy-engine transfer starts later than a kernel, so it pays only for large slots
// (transport::policy; transport-probe's ce_ag, docs/performance.md).
//
// The caller owns its communicator, so lowbit splits it with that policy once per
// communicator: comm::nccl_comm caches the split (copy_engines_comm()), every collective
// on it shares it, and each registers its workspace with both (transport::window_buffer).
#pragma once

#include <nccl.h>

#include <cstddef>
#include <string>

#include "lowbit/comm/nccl_comm.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/nccl_try.hpp"
#include "lowbit/transport/nccl/window_buffer.cuh"

#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= 22800 && defined(NCCL_CTA_POLICY_ZERO)
#define LOWBIT_HAS_NCCL_ZERO_CTA 1
#else
#define LOWBIT_HAS_NCCL_ZERO_CTA 0
#endif

namespace lowbit::transport {

/// All-gathers on a communicator's copy-engine split, or nothing (enabled() false) where
/// the NCCL headers predate CTA policies. Does not own the split: the nccl_comm does.
class copy_engines {
 public:
  copy_engines() = default;
  /// The copy engines of `comm`: its shared split, made by the first collective that asks
  /// (collective over the communicator: every rank asks alike).
  explicit copy_engines(const comm::nccl_comm& comm)
      : split_(comm.copy_engines_comm(&make_split)), rank_(comm.rank()) {}

  /// A new split of `parent` with NCCL_CTA_POLICY_ZERO (ncclCommSplit, collective over the
  /// parent), owned by the caller; null where NCCL has no CTA policies. Throws
  /// lowbit::nccl_error when the split fails.
  static ncclComm_t make_split(ncclComm_t parent) {
    ncclComm_t split = nullptr;
#if LOWBIT_HAS_NCCL_ZERO_CTA
    int rank = 0;
    LOWBIT_NCCL_TRY(ncclCommUserRank(parent, &rank));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
    const ncclResult_t r = ncclCommSplit(parent, 0, rank, &split, &config);
    if (r != ncclSuccess)
      throw nccl_error(__FILE__, __LINE__, static_cast<int>(r),
                       std::string("ncclCommSplit (zero-CTA policy, for the copy engines) "
                                   "failed: ") +
                           ncclGetErrorString(r) +
                           " (collective_options::transport = frame_transport::nccl_symmetric "
                           "moves frames with NCCL kernels instead)");
#else
    (void)parent;
#endif
    return split;
  }

  /// True when allgather() may be used.
  bool enabled() const noexcept { return split_ != nullptr; }
  /// The split (null unless enabled()): window buffers register with it too.
  ncclComm_t get() const noexcept { return split_; }

  /// In-place all-gather of P slots of `slot_bytes` at `offset` of `buf`, a symmetric
  /// window registered with get().
  void allgather(const window_buffer& buf, std::size_t offset, std::size_t slot_bytes,
                 cudaStream_t s) const {
    std::byte* base = buf.data() + offset;
    LOWBIT_NCCL_TRY(ncclAllGather(base + static_cast<std::size_t>(rank_) * slot_bytes, base,
                                  slot_bytes, ncclUint8, split_, s));
  }

 private:
  ncclComm_t split_ = nullptr;
  int rank_ = 0;
};

/// The copy-engine split of `comm` that every collective on it shares (null where NCCL has
/// no CTA policies); the first call makes it, collectively.
inline ncclComm_t copy_engines_comm(const comm::nccl_comm& comm) {
  return comm.copy_engines_comm(&copy_engines::make_split);
}

}  // namespace lowbit::transport
