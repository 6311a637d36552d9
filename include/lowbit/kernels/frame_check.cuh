// Frame headers on the device: the kernels that consume frames check the headers in front
// of them before they write a byte, and the kernels that produce frames write theirs, so a
// collective whose ranks disagree (another count, width, codec, step or call) leaves its
// output untouched and says so, without a host round trip inside the call.
//
// A kernel given a header_check reads the `count` headers in every warp (32 bytes each, from
// L2 after the first reads), and every warp decides alike: all agree, or none writes. The first
// disagreement found is recorded in a header_mismatch that the host reads (mapped pinned
// memory on the collectives' backend) after the stream has run. A kernel given a
// header_stamp writes that header in front of its frame, flagged `poisoned` by a reduce
// whose inputs disagreed, so the news travels on to every rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "lowbit/codec/frame_header.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/kernels/detail/launch.cuh"

namespace lowbit::kernels {

/// The first header a kernel found to disagree with its call. Zero-initialised by its
/// owner; `ready` becomes 1 once the other fields are written (and stays 1).
struct header_mismatch {
  unsigned int claimed = 0;  ///< set by the one thread that writes the record
  unsigned int ready = 0;    ///< 1 once from, got and want are visible to the host
  int from = 0;              ///< the index of the frame (= the rank that sent it)
  int unused = 0;
  lowbit::detail::frame_header got;   ///< what the frame's header says
  lowbit::detail::frame_header want;  ///< the call of the rank that checked it
};

/// The headers a kernel checks before it writes: `count` headers `stride` bytes apart from
/// `first` (device memory, 16-byte aligned); the one at index p must come from rank p and
/// describe the call `want`. count 0 checks nothing; `record` (device-accessible, may be
/// null) receives the first disagreement.
struct header_check {
  const std::byte* first = nullptr;
  std::size_t stride = 0;
  int count = 0;
  lowbit::detail::frame_header want;
  header_mismatch* record = nullptr;
};

/// A header a kernel writes at `at` (device memory, 16-byte aligned; null: none), in front
/// of the frame it produces.
struct header_stamp {
  std::byte* at = nullptr;
  lowbit::detail::frame_header header;
};

/// What a kernel that reads or writes frames does about their headers (nothing by default:
/// the plain codec passes, on bare frames).
struct framing {
  header_check check;
  header_stamp stamp;
};

namespace detail {

/// Loads a header (32 bytes, 16-byte aligned) from device memory.
__device__ __forceinline__ lowbit::detail::frame_header load_header(const std::byte* p) {
  const uint4 v[2] = {reinterpret_cast<const uint4*>(p)[0], reinterpret_cast<const uint4*>(p)[1]};
  lowbit::detail::frame_header h;
  memcpy(&h, v, sizeof h);
  return h;
}

/// Stores a header (32 bytes, 16-byte aligned) to device memory, as two vector stores.
__device__ __forceinline__ void store_header(std::byte* p, const lowbit::detail::frame_header& h) {
  uint4 v[2];
  memcpy(v, &h, sizeof h);
  reinterpret_cast<uint4*>(p)[0] = v[0];
  reinterpret_cast<uint4*>(p)[1] = v[1];
}

/// Records a disagreement unless one is recorded already (first claim wins).
__device__ __forceinline__ void record_mismatch(header_mismatch* r, int from,
                                                const lowbit::detail::frame_header& got,
                                                const lowbit::detail::frame_header& want) {
  if (r == nullptr || atomicCAS(&r->claimed, 0u, 1u) != 0u) return;
  r->from = from;
  r->got = got;
  r->want = want;
  __threadfence_system();  // the fields before the flag, for a host that polls the flag
  atomicExch(&r->ready, 1u);
}

/// True when every header `c` names agrees with its call. Every lane of the warp must call
/// it (it ends in a warp vote); every lane gets the same answer, and so does every warp of
/// the grid, which reads the same headers. A warp decides for itself, with no barrier:
/// the header's load latency is the whole cost, paid once per warp before its first tile.
__device__ __forceinline__ bool frames_agree(const header_check& c) {
  if (c.count == 0) return true;
  bool bad = false;
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int p = lane; p < c.count; p += 32) {
    const lowbit::detail::frame_header got =
        load_header(c.first + static_cast<std::size_t>(p) * c.stride);
    if (lowbit::detail::first_difference(got, c.want, static_cast<std::uint32_t>(p)) !=
        lowbit::detail::header_field::none) {
      bad = true;
      record_mismatch(c.record, p, got, c.want);
    }
  }
  return __any_sync(0xffffffffu, bad) == 0;
}

/// Starts fetching the line at `p` into L2 without waiting for it (a kernel's first codes,
/// requested before it waits on the headers, so the two latencies overlap).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/// Writes the stamp (poisoned when the frame after it carries no data), from one thread.
__device__ __forceinline__ void write_stamp(const header_stamp& s, bool poison) {
  if (s.at == nullptr || blockIdx.x != 0 || threadIdx.x != 0) return;
  lowbit::detail::frame_header h = s.header;
  if (poison) h.flags = static_cast<std::uint16_t>(h.flags | lowbit::detail::poisoned);
  store_header(s.at, h);
}

/// The header of a frame with no values (an empty piece), after checking `check`'s. (A
/// template only so that every translation unit including this header may define it.)
template <class = void>
__global__ void stamp_kernel(header_check check, header_stamp stamp) {
  const bool agree = frames_agree(check);
  write_stamp(stamp, !agree);
}

inline void check_framing(const framing& f, const char* what) {
  const std::string w(what);
  LOWBIT_EXPECTS(f.check.count >= 0, w + ": header_check::count is negative");
  LOWBIT_EXPECTS(f.check.count == 0 || (f.check.first != nullptr && aligned16(f.check.first) &&
                                        f.check.stride % 16 == 0),
                 w + ": the headers to check must be 16-byte aligned, 16-byte multiples apart");
  LOWBIT_EXPECTS(aligned16(f.stamp.at), w + ": header_stamp::at must be 16-byte aligned");
}

}  // namespace detail

/// Writes `f.stamp`'s header, flagged poisoned if a header `f.check` names disagrees (whose
/// record it then writes): the header of an empty frame. One CTA, on `stream`.
inline void stamp_header(const framing& f, cudaStream_t stream) {
  detail::check_framing(f, "kernels::stamp_header");
  if (f.stamp.at == nullptr && f.check.count == 0) return;
  detail::stamp_kernel<><<<1, 32, 0, stream>>>(f.check, f.stamp);
  LOWBIT_CHECK_LAUNCH();
}

}  // namespace lowbit::kernels
