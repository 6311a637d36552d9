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

/// The policy for a GPU of compute capability `major`.`minor`.
///
/// Hopper (9.x) and Blackwell (10.x, 12.x): 8 warps, 2 CTAs per SM budgeted (each lane
/// keeps 32 values, their codes and the packed words in registers: about 100 registers,
/// so 2 x 256 threads fill half the register file and leave the rest to the compiler),
/// and enough waves that every SM stays busy in the grid-stride loop. Older GPUs get
/// smaller CTAs, which schedule better on their smaller register files.
constexpr launch_policy select_launch_policy(int major, int minor = 0) {
  (void)minor;
  if (major >= 9) return launch_policy{256, 32, 2, 4};
  if (major >= 7) return launch_policy{256, 32, 2, 4};
  return launch_policy{128, 32, 4, 4};
}

/// True when `p` is a policy the kernels can be launched with.
constexpr bool is_valid(const launch_policy& p) {
  return p.threads_per_block >= 32 && p.threads_per_block % 32 == 0 &&
         p.threads_per_block <= launch_policy::max_threads && p.items_per_thread == 32 &&
         p.blocks_per_sm >= 1 && p.waves >= 1;
}

}  // namespace lowbit::kernels
