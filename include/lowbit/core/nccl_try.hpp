// LOWBIT_NCCL_TRY: an NCCL status turned into lowbit::nccl_error. Apart from error.hpp
// because it needs nccl.h (and through it the CUDA runtime's headers), which the host-only
// headers must never include, whatever happens to be on the include path.
#pragma once

#include <nccl.h>

#include <cstdio>
#include <string>

#include "lowbit/core/error.hpp"

/// Calls an NCCL function and throws lowbit::nccl_error when it fails.
#define LOWBIT_NCCL_TRY(call)                                                   \
  do {                                                                          \
    ncclResult_t lowbit_status_ = (call);                                       \
    if (lowbit_status_ != ncclSuccess && lowbit_status_ != ncclInProgress)      \
      throw ::lowbit::nccl_error(                                               \
          __FILE__, __LINE__, static_cast<int>(lowbit_status_),                 \
          std::string(#call " failed: ") + ncclGetErrorString(lowbit_status_)); \
  } while (0)

/// For destructors: reports a failed NCCL call on stderr instead of throwing.
#define LOWBIT_NCCL_TRY_NO_THROW(call)                                          \
  do {                                                                          \
    ncclResult_t lowbit_status_ = (call);                                       \
    if (lowbit_status_ != ncclSuccess && lowbit_status_ != ncclInProgress)      \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                   ncclGetErrorString(lowbit_status_));                         \
  } while (0)
