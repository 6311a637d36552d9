// A communicator on which NCCL runs without CTAs where it can: a split of the caller's
// communicator with config.CTAPolicy = NCCL_CTA_POLICY_ZERO (NCCL >= 2.28). On one node,
// an all-gather between buffers of a symmetric window registered with it is carried out
// by the GPUs' copy engines instead of an NCCL kernel, so it takes no SM from the codec
// kernels that run beside it (frame_transport::copy_engines). One per communicator:
// nccl_comm::zero_cta_split() creates it on first use and every collective shares it.
#pragma once

#include <nccl.h>

#include <string>
#include <utility>

#include "lowbit/core/error.hpp"

#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= 22800 && defined(NCCL_CTA_POLICY_ZERO)
#define LOWBIT_HAS_NCCL_ZERO_CTA 1
#else
#define LOWBIT_HAS_NCCL_ZERO_CTA 0
#endif

namespace lowbit::detail {

/// Owns the zero-CTA split of a communicator, or nothing (enabled() false) when the NCCL
/// headers predate CTA policies. Creation is collective over the parent. Move-only; the
/// owner destroys (or aborts) it before the parent.
class zero_cta_comm {
 public:
  zero_cta_comm() = default;
  explicit zero_cta_comm(ncclComm_t parent) {
#if LOWBIT_HAS_NCCL_ZERO_CTA
    int rank = 0;
    LOWBIT_NCCL_TRY(ncclCommUserRank(parent, &rank));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
    const ncclResult_t r = ncclCommSplit(parent, 0, rank, &comm_, &config);
    if (r != ncclSuccess)
      throw nccl_error(__FILE__, __LINE__, static_cast<int>(r),
                       std::string("ncclCommSplit (zero-CTA policy) failed: ") +
                           ncclGetErrorString(r) +
                           " (collective_options::transport = frame_transport::nccl_symmetric "
                           "moves frames with NCCL kernels instead)");
#else
    (void)parent;
#endif
  }
  zero_cta_comm(const zero_cta_comm&) = delete;
  zero_cta_comm& operator=(const zero_cta_comm&) = delete;
  zero_cta_comm(zero_cta_comm&& o) noexcept { std::swap(comm_, o.comm_); }
  zero_cta_comm& operator=(zero_cta_comm&& o) noexcept {
    if (this != &o) {
      release();
      std::swap(comm_, o.comm_);
    }
    return *this;
  }
  ~zero_cta_comm() { release(); }

  /// The split communicator (null unless enabled()).
  ncclComm_t get() const noexcept { return comm_; }
  bool enabled() const noexcept { return comm_ != nullptr; }

  /// Aborts the split (ncclCommAbort) and forgets it: for when its parent is aborted.
  void abort() noexcept {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  void release() noexcept {
    if (comm_ != nullptr) LOWBIT_NCCL_TRY_NO_THROW(ncclCommDestroy(comm_));
    comm_ = nullptr;
  }

  ncclComm_t comm_ = nullptr;
};

}  // namespace lowbit::detail
