// How large a collective object's workspace must be: upper bounds, over every count up to
// max_count, of the frames a call moves (engine.hpp allocates them at construction, so no
// call allocates), computed with arithmetic that refuses to wrap.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

#include "lowbit/core/error.hpp"

namespace lowbit::detail {

/// Upper bounds, over every count <= max_count, of the workspace a call needs. A slot
/// holds a header of `header` bytes and a frame of n values, at most nb*(meta + codes) +
/// 30 bytes (two 16-byte alignments); the pieces of all shards hold each block once; a
/// rank's shard has at most ceil(nblocks/P) blocks and its pieces at most K more than
/// that in total.
struct capacity {
  std::size_t send = 0, recv = 0, gather = 0, shard = 0;
};

/// Size arithmetic that refuses to wrap: a max_count whose workspace cannot be represented
/// in size_t is refused at construction, not discovered as a tiny buffer and a crash.
class size_math {
 public:
  size_math(const char* who, std::size_t max_count) : who_(who), max_count_(max_count) {}
  std::size_t add(std::size_t a, std::size_t b) const {
    if (a > SIZE_MAX - b) fail();
    return a + b;
  }
  std::size_t mul(std::size_t a, std::size_t b) const {
    if (b != 0 && a > SIZE_MAX / b) fail();
    return a * b;
  }

 private:
  [[noreturn]] void fail() const {
    throw invalid_argument(__FILE__, __LINE__,
                           std::string(who_) + ": max_count " + std::to_string(max_count_) +
                               " is too large: its workspace size cannot be represented");
  }
  const char* who_;
  std::size_t max_count_;
};

/// What an engine serves: all_reduce (whose algorithm sizes the workspace) or
/// reduce_scatter / all_gather (two_phase's halves, whatever options().algorithm says).
enum class collective_kind { all_reduce, scatter_gather };

template <class Codec>
capacity capacity_of(std::size_t max_count, int ranks, int chunks, bool one_shot,
                     std::size_t header, const size_math& m) {
  capacity c;
  const std::size_t P = static_cast<std::size_t>(ranks), K = static_cast<std::size_t>(chunks);
  const std::size_t B = static_cast<std::size_t>(Codec::block_size);
  const std::size_t nblocks = m.add(max_count, B - 1) / B;
  const std::size_t block_bytes = sizeof(typename Codec::meta_type) + Codec::block_code_bytes;
  const std::size_t slack = header + 32;  // per slot: the header and two alignments
  if (one_shot) {  // only P slots of every piece of the whole tensor; sums of whole pieces
    c.gather = m.mul(P, m.add(m.mul(nblocks, block_bytes), m.mul(slack, K)));
    c.shard = max_count;
  } else {
    const std::size_t shard_blocks = (nblocks + P - 1) / P;
    c.send = m.add(m.mul(nblocks, block_bytes), m.mul(m.mul(slack, K), P));
    c.recv = m.mul(P, m.add(m.mul(m.add(shard_blocks, K), block_bytes), m.mul(slack, K)));
    c.gather = c.recv;
    c.shard = std::min(max_count, m.mul(shard_blocks, B));
  }
  return c;
}

}  // namespace lowbit::detail
