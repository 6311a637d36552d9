// Frame headers on the device: the kernels that consume frames check the headers in front
// of them before they write a byte, and the kernels that produce frames write theirs, so a
// collective whose ranks disagree (another count, width, codec, step or call) leaves its
// output untouched and says so, without a host round trip inside the call.
//
// A kernel given a header_check reads the `count` headers once per CTA (warp 0: a word a
// lane, from L2 after the first reads, the load issued at the top and judged before the
// warp's first store; the other warps take its verdict from shared memory before theirs),
// and every CTA decides alike: all agree, or none writes. The first
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

/// The headers a kernel checks before it writes: a header_set (codec/frame_header.hpp) in
/// device memory, headers 16-byte aligned, and `record` (device-accessible, may be null),
/// which receives the first disagreement.
struct header_check : lowbit::detail::header_set {
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

/// A warp's check of the headers `c` names, issued early and judged late. Each lane loads
/// one 32-bit word of them (lane l: word l % 8 of header l / 8) when the probe is made, at
/// the top of a kernel; agree() compares and votes where the warp first writes, so the
/// load's latency hides behind the warp's first tile instead of delaying it.
class header_probe {
 public:
  /// `load` false: the probe of a warp that will not judge (cta_header_probe's warps past
  /// the first), which loads nothing.
  __device__ __forceinline__ explicit header_probe(const header_check& c, bool load = true) {
    const int l = lane();
    if (load && l < 8 * c.count) word_ = load_word(c, l);
  }

  /// True when every header agrees with its call. Every lane of the warp must call it (it
  /// ends in a warp vote); every lane gets the same answer, and so does every warp of the
  /// grid, which reads the same headers. On a disagreement the lowest disagreeing frame is
  /// recorded, whole, in c.record.
  __device__ __forceinline__ bool agree(const header_check& c) const {
    if (c.count == 0) return true;
    // One vote per 32 words, not a minimum across the warp: the lowest lane whose word
    // disagrees holds the lowest index, so the first set bit of the first nonzero ballot
    // names the first disagreeing frame. The loop's trip count is the warp's (uniform).
    const int n = 8 * c.count;
    for (int base = 0; base < n; base += 32) {
      const int i = base + lane();
      bool bad = false;
      if (i < n) {
        const std::uint32_t w = base == 0 ? word_ : load_word(c, i);
        const std::uint32_t mask = i % 8 == 6 ? bits_and_poison : ~0u;
        bad = ((w ^ expected(c.want, i / 8, i % 8)) & mask) != 0u;
      }
      const unsigned votes = __ballot_sync(0xffffffffu, bad);
      if (votes != 0u) {
        const int p = (base + __ffs(static_cast<int>(votes)) - 1) / 8;
        if (lane() == 0) {
          const lowbit::detail::frame_header got =
              load_header(c.first + static_cast<std::size_t>(p) * c.stride);
          record_mismatch(c.record, p, got, c.want);
        }
        return false;
      }
    }
    return true;
  }

 private:
  /// Word 6 holds bits (low half) and flags (high half): only the flag that means something
  /// is compared, as first_difference does.
  static constexpr std::uint32_t bits_and_poison =
      0xffffu | (static_cast<std::uint32_t>(lowbit::detail::poisoned) << 16);

  static __device__ __forceinline__ int lane() { return static_cast<int>(threadIdx.x % 32); }
  /// Through the read-only (non-coherent) path: headers are written before the kernel that
  /// checks them starts (by an earlier kernel, a copy or a peer's stores ordered by the
  /// stream) and never during it.
  static __device__ __forceinline__ std::uint32_t load_word(const header_check& c, int i) {
    return __ldg(reinterpret_cast<const unsigned int*>(c.first +
                                                       static_cast<std::size_t>(i / 8) * c.stride) +
                 i % 8);
  }
  /// Word k of the header frame p of the call `want` must carry. Selects, not a switch: the
  /// lanes of a warp hold all eight k, and a switch on k ran its eight cases one after the
  /// other (about 60 instructions a warp, against a few hundred for a decode tile: most of
  /// the header check's measured cost).
  static __device__ __forceinline__ std::uint32_t expected(const lowbit::detail::frame_header& want,
                                                           int p, int k) {
    std::uint32_t e = static_cast<std::uint32_t>(p);
    e = k == 6 ? static_cast<std::uint32_t>(want.bits) : e;  // flags: none
    e = k == 5 ? want.seq : e;
    e = k == 4 ? want.step : e;
    e = k == 3 ? static_cast<std::uint32_t>(want.count >> 32) : e;
    e = k == 2 ? static_cast<std::uint32_t>(want.count) : e;
    e = k == 1 ? want.config : e;
    e = k == 0 ? lowbit::detail::frame_magic : e;
    return e;
  }

  std::uint32_t word_ = 0;
};
static_assert(offsetof(lowbit::detail::frame_header, bits) == 24 &&
                  offsetof(lowbit::detail::frame_header, flags) == 26 &&
                  offsetof(lowbit::detail::frame_header, rank) == 28,
              "header_probe reads frame_header as eight little-endian words");

/// A CTA's check of the headers `c` names: warp 0 probes them (header_probe: its load issued
/// at the top, judged where it first writes) and hands its verdict to the CTA's other warps
/// through a word of shared memory, which they read where they first write. A grid of tens
/// of thousands of warps (one or two tiles each at the sizes a collective sends) then loads
/// and compares the headers once per CTA, not once per warp: the other warps carry no header
/// word in a register and run no comparison or vote.
///
/// Every thread of the CTA must construct it, at the top of the kernel (it ends in
/// __syncthreads when there is something to check). A warp that calls agree() before warp 0
/// has judged waits for the verdict (warps of a CTA are resident together, so warp 0 makes
/// progress): warp 0 must itself call agree(), which the codec kernels guarantee by sizing
/// the grid so that warp 0 of every CTA has a tile (grid_size: at most
/// ceil(tiles / warps per CTA) CTAs), and calling it in their first tile.
class cta_header_probe {
 public:
  __device__ __forceinline__ cta_header_probe(const header_check& c, unsigned* verdict)
      : probe_(c, threadIdx.x < 32), verdict_(verdict) {
    if (c.count == 0) return;  // uniform across the grid
    if (threadIdx.x == 0) *verdict_ = pending;
    __syncthreads();
  }

  /// True when every header agrees with its call; every lane of a warp must call it (warp 0
  /// ends in a warp vote), and every warp of the grid gets the same answer.
  __device__ __forceinline__ bool agree(const header_check& c) const {
    if (c.count == 0) return true;
    if (threadIdx.x < 32) {
      const bool ok = probe_.agree(c);
      if (threadIdx.x == 0) atomicExch(verdict_, ok ? agreed : refused);
      return ok;
    }
    // Shared-memory atomics, not volatile accesses: the hand-off is then no data race for
    // compute-sanitizer's racecheck, and costs a few cycles once per warp.
    unsigned v;
    while ((v = atomicOr(verdict_, 0u)) == pending) {
    }
    return v == agreed;
  }

 private:
  static constexpr unsigned pending = 0u, agreed = 1u, refused = 2u;
  header_probe probe_;
  unsigned* verdict_;
};

/// header_probe(c).agree(c): for kernels with nothing to overlap the check with.
__device__ __forceinline__ bool frames_agree(const header_check& c) {
  return header_probe(c).agree(c);
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

/// Throws lowbit::invalid_argument, naming `what`, for headers a kernel could not read or
/// write with vector accesses. (The messages are built only on failure: this runs on every
/// launch.)
inline void check_framing(const framing& f, const char* what) {
  LOWBIT_EXPECTS(f.check.count >= 0, std::string(what) + ": header_check::count is negative");
  LOWBIT_EXPECTS(f.check.count == 0 || (f.check.first != nullptr && aligned16(f.check.first) &&
                                        f.check.stride % 16 == 0),
                 std::string(what) +
                     ": the headers to check must be 16-byte aligned, 16-byte multiples apart");
  LOWBIT_EXPECTS(aligned16(f.stamp.at),
                 std::string(what) + ": header_stamp::at must be 16-byte aligned");
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
