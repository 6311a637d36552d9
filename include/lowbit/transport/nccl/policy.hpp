// Which transport moves each all-gather of frames on the NCCL backend: a tuning policy
// (a plain constexpr aggregate, in the style of CUB's tuning policies), the selector that
// returns lowbit's measured one, and the pure decisions transport::frame_mover makes with
// it. Host-only (no CUDA or NCCL header), so that the decisions are tested and printed
// on any machine (test/transport/transport_policy_test.cpp).
//
// Why these knobs: the three transports that beat NCCL's kernels each cost something.
// Peer stores are the fastest kernel but take SMs from the codec, so they pay only where
// the frames make the transfer the bottleneck (wide codes). Copy engines take no SM but
// start later than a kernel, so they pay only for large slots, larger still where the
// transfer competes with peer stores or overlaps nothing (a one-chunk call). The
// thresholds were measured on 2x H200 over NVLink; docs/performance.md has the figures,
// docs/design.md ("Frames live in symmetric NCCL windows") the reasoning.
#pragma once

#include <cstddef>
#include <ostream>
#include <sstream>
#include <string>

#include "lowbit/transport/frame_transport.hpp"

namespace lowbit::transport {

/// frame_transport::automatic's thresholds and the peer-store kernel's size. The same on
/// every rank (every rank must choose alike). Set through
/// collective_options::transport_policy; default_policy() by default.
struct policy {
  /// In a pipelined call (the transfer overlaps the codec), all-gathers of slots of at
  /// least this many bytes (one rank's frames) run on the copy engines where NCCL has CTA
  /// policies; smaller ones on NCCL's kernels. frame_transport::automatic only.
  std::size_t copy_engine_min_bytes;
  /// The same threshold where the copy engines must win on speed alone: against peer
  /// stores (codes of peer_store_min_bits or more), or in a one-chunk call, where nothing
  /// overlaps the transfer. frame_transport::automatic only.
  std::size_t copy_engine_min_bytes_alone;
  /// automatic: all-gathers of codes at least this wide are peer stores where every peer
  /// is load/store accessible (below the copy engines' threshold); narrower ones NCCL's
  /// kernels. frame_transport::peer_stores stores at every width.
  int peer_store_min_bits;
  /// CTAs of the peer-store kernel, one LSA barrier each: 1..1024.
  int peer_store_ctas;
};

/// The selector: lowbit's measured policy (2x H200, NVLink, NCCL 2.28;
/// docs/performance.md). Other machines may differ: measure with lowbit-perf
/// (--copy-engine-min-bytes, --peer-store-ctas) and set collective_options::transport_policy.
constexpr policy default_policy() noexcept {
  return policy{
      /*copy_engine_min_bytes=*/std::size_t{10} << 20,
      /*copy_engine_min_bytes_alone=*/std::size_t{32} << 20,
      /*peer_store_min_bits=*/8,
      /*peer_store_ctas=*/64,
  };
}

/// True when every field is in range (the NCCL backend refuses others at construction).
constexpr bool valid(const policy& p) noexcept {
  return p.peer_store_ctas >= 1 && p.peer_store_ctas <= 1024;
}

constexpr bool operator==(const policy& a, const policy& b) noexcept {
  return a.copy_engine_min_bytes == b.copy_engine_min_bytes &&
         a.copy_engine_min_bytes_alone == b.copy_engine_min_bytes_alone &&
         a.peer_store_min_bits == b.peer_store_min_bits && a.peer_store_ctas == b.peer_store_ctas;
}
constexpr bool operator!=(const policy& a, const policy& b) noexcept { return !(a == b); }

inline std::ostream& operator<<(std::ostream& os, const policy& p) {
  return os << "transport::policy{copy_engine_min_bytes=" << p.copy_engine_min_bytes
            << ", copy_engine_min_bytes_alone=" << p.copy_engine_min_bytes_alone
            << ", peer_store_min_bits=" << p.peer_store_min_bits
            << ", peer_store_ctas=" << p.peer_store_ctas << "}";
}

/// The policy as one line, for logs and benchmark headers.
inline std::string to_string(const policy& p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

/// What a communicator offers the transports (answered by the NCCL backend at
/// construction, collectively; see transport::frame_mover).
struct support {
  /// Symmetric windows can be registered: NCCL >= 2.27 and more than one rank.
  bool symmetric_windows = false;
  /// A peer-store device communicator could be made: NCCL's device API (>= 2.28) and every
  /// rank load/store accessible, in rank order.
  bool peer_stores = false;
  /// Every peer's memory is mapped (NVLink or PCIe P2P): the communicator's cached answer,
  /// asked only by frame_transport::automatic.
  bool peers_mapped = false;
  /// NCCL has CTA policies, so the communicator has a copy-engine (zero-CTA) split.
  bool cta_policies = false;
};

/// What a collective object resolved at construction: which transports its all-gathers
/// may use, and the thresholds between them.
struct setup {
  bool symmetric = false;       ///< the workspace is symmetric NCCL windows
  bool peer_stores = false;     ///< all-gathers of wide enough codes may be peer stores
  int peer_store_min_bits = 0;  ///< ... codes at least this wide
  bool copy_engines = false;    ///< all-gathers of large enough slots may run on copy engines
  std::size_t copy_engine_min_bytes = 0;        ///< ... in a pipelined call, against kernels
  std::size_t copy_engine_min_bytes_alone = 0;  ///< ... against peer stores or in one chunk
};

/// Whether a collective asking for `t`, with codes of at most `widest_bits`, makes a
/// peer-store device communicator (collective) before its windows are registered.
constexpr bool wants_peer_stores(const policy& p, frame_transport t, int widest_bits) noexcept {
  return t == frame_transport::peer_stores ||
         (t == frame_transport::automatic && widest_bits >= p.peer_store_min_bits);
}

/// Whether a collective asking for `t` takes the communicator's copy-engine split:
/// copy_engines always, automatic only where the peers are mapped (without that NCCL has no
/// copy-engine path).
constexpr bool wants_copy_engines(frame_transport t, bool peers_mapped) noexcept {
  return t == frame_transport::copy_engines || (t == frame_transport::automatic && peers_mapped);
}

/// The set-up of a collective asking for `t` with codes of at most `widest_bits` bits, on a
/// communicator offering `s`.
constexpr setup resolve(const policy& p, frame_transport t, const support& s,
                        int widest_bits) noexcept {
  setup r{};
  r.symmetric = s.symmetric_windows && t != frame_transport::nccl;
  if (!r.symmetric) return r;
  r.peer_store_min_bits = t == frame_transport::peer_stores ? 0 : p.peer_store_min_bits;
  r.peer_stores = s.peer_stores && wants_peer_stores(p, t, widest_bits);
  r.copy_engines = s.cta_policies && wants_copy_engines(t, s.peers_mapped);
  if (r.copy_engines && t != frame_transport::copy_engines) {
    r.copy_engine_min_bytes = p.copy_engine_min_bytes;
    r.copy_engine_min_bytes_alone = p.copy_engine_min_bytes_alone;
  }
  return r;
}

/// What a collective reports as its transport (collective::transport()): that of the
/// largest all-gathers of its widest codes.
constexpr frame_transport reported(const setup& s) noexcept {
  return s.copy_engines  ? frame_transport::copy_engines
         : s.peer_stores ? frame_transport::peer_stores
         : s.symmetric   ? frame_transport::nccl_symmetric
                         : frame_transport::nccl;
}

/// Which transport moves one all-gather of `slot_bytes` per rank of `bits`-bit codes;
/// `overlapped`: the call has several chunks, so the transfer runs beside the codec.
/// Never automatic; nccl and nccl_symmetric are both ncclAllGather on the communicator.
constexpr frame_transport choose(const setup& s, int bits, std::size_t slot_bytes,
                                 bool overlapped) noexcept {
  if (!s.symmetric) return frame_transport::nccl;
  const bool stores = s.peer_stores && bits >= s.peer_store_min_bits;
  const bool engines =
      s.copy_engines && slot_bytes >= (overlapped && !stores ? s.copy_engine_min_bytes
                                                             : s.copy_engine_min_bytes_alone);
  return engines  ? frame_transport::copy_engines
         : stores ? frame_transport::peer_stores
                  : frame_transport::nccl_symmetric;
}

/// resolve() then choose(): the whole decision for one all-gather.
constexpr frame_transport choose_allgather(const policy& p, frame_transport requested,
                                           const support& s, int widest_bits, int bits,
                                           std::size_t slot_bytes, bool overlapped) noexcept {
  return choose(resolve(p, requested, s, widest_bits), bits, slot_bytes, overlapped);
}

}  // namespace lowbit::transport
