// Host-side helpers shared by the kernels' entry points: the device's launch policy
// and grid size, and the argument checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "lowbit/core/error.hpp"
#include "lowbit/kernels/launch_policy.cuh"

namespace lowbit::kernels::detail {

/// The current device's multiprocessor count and compute capability (cached by the
/// runtime: no synchronisation, no allocation).
struct device_info {
  int sms = 1;
  int major = 0;
  int minor = 0;
};

inline device_info current_device_info() {
  int dev = 0;
  LOWBIT_CUDA_TRY(cudaGetDevice(&dev));
  device_info d;
  LOWBIT_CUDA_TRY(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
  LOWBIT_CUDA_TRY(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev));
  LOWBIT_CUDA_TRY(cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, dev));
  return d;
}

/// The policy the current device selects for pass k.
inline launch_policy default_policy(pass k) {
  const device_info d = current_device_info();
  return select_launch_policy(d.major, d.minor, k);
}

/// CTAs for `warp_tiles` tiles of warp work: enough to cover them, capped at the
/// policy's resident CTAs times its waves (the kernels loop over the rest).
inline unsigned grid_size(const launch_policy& p, std::size_t warp_tiles) {
  LOWBIT_EXPECTS(is_valid(p),
                 "lowbit::kernels: invalid launch_policy (threads_per_block must be a "
                 "multiple of 32 in [32, 256], items_per_thread 32)");
  const std::size_t warps = static_cast<std::size_t>(p.threads_per_block / 32);
  const std::size_t needed = (warp_tiles + warps - 1) / warps;
  int dev = 0, sms = 1;
  LOWBIT_CUDA_TRY(cudaGetDevice(&dev));
  LOWBIT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const std::size_t cap = static_cast<std::size_t>(sms) * p.blocks_per_sm * p.waves;
  const std::size_t g = needed < cap ? needed : cap;
  return static_cast<unsigned>(g < 1 ? 1 : g);
}

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

inline void check_frame_pointer(const void* frame, std::size_t count, const char* what) {
  LOWBIT_EXPECTS(count == 0 || frame != nullptr, std::string(what) + ": frame is null");
  LOWBIT_EXPECTS(aligned16(frame), std::string(what) + ": frame must be 16-byte aligned");
}

inline void check_index0(std::uint64_t index0, const char* what) {
  LOWBIT_EXPECTS(index0 % 32 == 0, std::string(what) + ": index0 must be a multiple of 32");
}

}  // namespace lowbit::kernels::detail
