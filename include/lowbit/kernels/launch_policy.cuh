// The launch configuration of the codec kernels, chosen at compile time from a compute
// capability (CUB's newer tuning style: a plain aggregate from a constexpr selector).
// Nothing here needs nvcc, so the table is printable and testable on the host.
#pragma once

namespace lowbit::kernels {

/// How a codec kernel is launched.
///
/// Every kernel gives one thread one packing group of 32 values (`items_per_thread`):
/// the group is the codec's unit of packing, so each thread writes whole words. A warp
/// stages its 32 groups through shared memory so that global loads and stores are
/// coalesced 16-byte vectors.
struct launch_policy {
  int threads_per_block;  ///< threads of one CTA; a multiple of 32, at most max_threads
  int items_per_thread;   ///< values one thread codes per tile (one packing group)
  int blocks_per_sm;      ///< CTAs resident per multiprocessor that the grid is sized for
  int waves;              ///< grid = min(work, blocks_per_sm * SMs * waves) CTAs

  /// The most threads a CTA may have: the kernels' __launch_bounds__ and shared-memory
  /// arrays are sized for it.
  static constexpr int max_threads = 256;
};

/// The kernel a policy is for: the passes differ in registers and in how much
/// arithmetic they do per byte, so they fill a multiprocessor differently.
enum class pass { encode, decode, reduce };

/// The policy for pass `k` on a GPU of compute capability `major`.`minor`.
///
/// Hopper (9.x) and later: encode and decode run 8-warp CTAs with the grid capped at
/// 4 CTAs x 8 waves per SM (up to 4 CTAs of 8 warps fit an SM: 36 KiB of staging each,
/// under 64 registers a thread); decode-accumulate-encode (96 registers a thread, 128
/// with a second-stage state: reduce_max_registers) runs 4-warp CTAs, 8 per SM at most.
/// Measured on an H200 at 256 MiB, 4-bit codes (see docs/performance.md): 3-5% over
/// {256, 2 x 4} for encode and decode, 3-11% for the reduction. Older GPUs get the same
/// shapes, unmeasured.
constexpr launch_policy select_launch_policy(int major, int minor = 0, pass k = pass::encode) {
  (void)minor;
  (void)major;
  if (k == pass::reduce) return launch_policy{128, 32, 8, 4};
  return launch_policy{256, 32, 4, 8};
}

/// True when `p` is a policy the kernels can be launched with.
constexpr bool is_valid(const launch_policy& p) {
  return p.threads_per_block >= 32 && p.threads_per_block % 32 == 0 &&
         p.threads_per_block <= launch_policy::max_threads && p.items_per_thread == 32 &&
         p.blocks_per_sm >= 1 && p.waves >= 1;
}

}  // namespace lowbit::kernels
