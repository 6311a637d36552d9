// A mixed-precision plan: a precision for every op on every device group and a
// communication bit-width for every gradient bucket.
#pragma once

#include <vector>

#include "lowbit/qsync/precision.hpp"

namespace lowbit::qsync {

/// The allocator's output and the simulator's input.
struct plan {
  /// precisions[g][i]: op i's precision on device group g (parameter-free ops included,
  /// as resolved from their inputs).
  std::vector<std::vector<precision>> precisions;
  /// bucket_bits[k]: bits per element for bucket k's all-reduce (1..16, or 32 = fp32).
  std::vector<int> bucket_bits;

  /// Plans compare equal when every choice is the same.
  friend bool operator==(const plan& a, const plan& b) {
    return a.precisions == b.precisions && a.bucket_bits == b.bucket_bits;
  }
  friend bool operator!=(const plan& a, const plan& b) { return !(a == b); }
};

}  // namespace lowbit::qsync
