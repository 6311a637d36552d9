// transport::policy and the decisions the NCCL backend's frame_mover makes with it: which
// transport moves each all-gather of frames. Host-only: the decisions are pure constexpr
// functions of the policy, the requested frame_transport, what the communicator offers,
// the code width, the slot size and whether the call overlaps its transfers.
#include <catch2/catch.hpp>

#include <cstddef>
#include <sstream>
#include <string>

#include "lowbit/collective/types.hpp"
#include "lowbit/transport/nccl/policy.hpp"

namespace {

using lowbit::frame_transport;
namespace tr = lowbit::transport;

constexpr std::size_t KiB = std::size_t{1} << 10, MiB = std::size_t{1} << 20;

// What communicators offer.
constexpr tr::support nvlink{true, true, true, true};          // NCCL 2.28, one NVLink domain
constexpr tr::support nvlink_no_cta{true, true, true, false};  // device API, no CTA policies
constexpr tr::support pcie_no_p2p{true, false, false, true};   // peers not mapped
constexpr tr::support nccl_2_27{true, false, false, false};    // windows only
constexpr tr::support no_windows{};                            // NCCL < 2.27, or one rank

/// The NCCL backend's decisions as they were written before transport/ existed
/// (backend_impl<nccl>::set_transport, transport() and allgather()), transcribed: the
/// reference the policy's functions must reproduce.
struct reference {
  bool symmetric = false, lsa = false, ce = false;
  int min_store_bits = 0;
  std::size_t ce_min = 0, ce_min_alone = 0;

  reference(const tr::policy& p, frame_transport t, const tr::support& s, int widest_bits) {
    symmetric = s.symmetric_windows && t != frame_transport::nccl;
    if (!symmetric) return;
    min_store_bits = t == frame_transport::peer_stores ? 0 : p.peer_store_min_bits;
    const bool stores = (t == frame_transport::peer_stores || t == frame_transport::automatic) &&
                        widest_bits >= min_store_bits;
    lsa = stores && s.peer_stores;
    const bool mapped = s.peers_mapped;
    if (t == frame_transport::copy_engines || (t == frame_transport::automatic && mapped)) {
      ce = s.cta_policies;
      const bool always = t == frame_transport::copy_engines;
      ce_min = always ? 0 : p.copy_engine_min_bytes;
      ce_min_alone = always ? 0 : p.copy_engine_min_bytes_alone;
    }
  }
  frame_transport transport() const {
    return ce          ? frame_transport::copy_engines
           : lsa       ? frame_transport::peer_stores
           : symmetric ? frame_transport::nccl_symmetric
                       : frame_transport::nccl;
  }
  frame_transport allgather(int bits, std::size_t slot_bytes, bool overlap) const {
    const bool stores = lsa && symmetric && bits >= min_store_bits;
    const bool engines =
        ce && symmetric && slot_bytes >= (overlap && !stores ? ce_min : ce_min_alone);
    if (stores && !engines) return frame_transport::peer_stores;
    return engines     ? frame_transport::copy_engines
           : symmetric ? frame_transport::nccl_symmetric
                       : frame_transport::nccl;
  }
};

frame_transport choose(frame_transport t, const tr::support& s, int widest, int bits,
                       std::size_t slot, bool overlapped,
                       const tr::policy& p = tr::default_policy()) {
  return tr::choose_allgather(p, t, s, widest, bits, slot, overlapped);
}

}  // namespace

TEST_CASE("default_policy: the measured thresholds, printable") {
  constexpr tr::policy p = tr::default_policy();
  STATIC_REQUIRE(p.copy_engine_min_bytes == 10 * MiB);
  STATIC_REQUIRE(p.copy_engine_min_bytes_alone == 32 * MiB);
  STATIC_REQUIRE(p.peer_store_min_bits == 8);
  STATIC_REQUIRE(p.peer_store_ctas == 64);
  STATIC_REQUIRE(tr::valid(p));
  const std::string s = tr::to_string(p);
  std::ostringstream os;
  os << p;
  CHECK(os.str() == s);
  CHECK(s ==
        "transport::policy{copy_engine_min_bytes=10485760, copy_engine_min_bytes_alone=33554432, "
        "peer_store_min_bits=8, peer_store_ctas=64}");
  WARN("lowbit's default " << s);
  // What collectives use unless told otherwise.
  CHECK(lowbit::collective_options{}.transport_policy == p);
  CHECK(lowbit::collective_options{}.transport == frame_transport::automatic);
}

TEST_CASE("valid: the peer-store kernel takes 1..1024 CTAs") {
  tr::policy p = tr::default_policy();
  p.peer_store_ctas = 0;
  CHECK_FALSE(tr::valid(p));
  p.peer_store_ctas = 1025;
  CHECK_FALSE(tr::valid(p));
  p.peer_store_ctas = 1024;
  CHECK(tr::valid(p));
  CHECK(p != tr::default_policy());
}

TEST_CASE("the decisions are constexpr") {
  STATIC_REQUIRE(tr::choose_allgather(tr::default_policy(), frame_transport::automatic, nvlink, 4,
                                      4, 16 * MiB, true) == frame_transport::copy_engines);
  STATIC_REQUIRE(tr::reported(tr::resolve(tr::default_policy(), frame_transport::automatic,
                                          pcie_no_p2p, 8)) == frame_transport::nccl_symmetric);
}

TEST_CASE("nccl, or no symmetric windows: NCCL's kernels on cudaMalloc memory") {
  for (const auto t : lowbit::all_frame_transports) {
    CHECK(choose(t, no_windows, 8, 8, 64 * MiB, true) == frame_transport::nccl);
    CHECK(tr::reported(tr::resolve(tr::default_policy(), t, no_windows, 8)) ==
          frame_transport::nccl);
  }
  CHECK(choose(frame_transport::nccl, nvlink, 8, 8, 64 * MiB, true) == frame_transport::nccl);
  CHECK(tr::reported(tr::resolve(tr::default_policy(), frame_transport::nccl, nvlink, 4)) ==
        frame_transport::nccl);
}

TEST_CASE("nccl_symmetric: NCCL's kernels on the windows, whatever the size") {
  for (std::size_t slot : {std::size_t{1}, 10 * MiB, 1024 * MiB})
    CHECK(choose(frame_transport::nccl_symmetric, nvlink, 8, 8, slot, true) ==
          frame_transport::nccl_symmetric);
}

TEST_CASE("automatic, narrow codes over NVLink: copy engines from 10 MiB in a pipeline") {
  const auto a = frame_transport::automatic;
  CHECK(tr::reported(tr::resolve(tr::default_policy(), a, nvlink, 4)) ==
        frame_transport::copy_engines);
  CHECK(choose(a, nvlink, 4, 4, 10 * MiB, true) == frame_transport::copy_engines);
  CHECK(choose(a, nvlink, 4, 4, 10 * MiB - 1, true) == frame_transport::nccl_symmetric);
  // A one-chunk call: nothing overlaps the transfer, so 32 MiB.
  CHECK(choose(a, nvlink, 4, 4, 10 * MiB, false) == frame_transport::nccl_symmetric);
  CHECK(choose(a, nvlink, 4, 4, 32 * MiB - 1, false) == frame_transport::nccl_symmetric);
  CHECK(choose(a, nvlink, 4, 4, 32 * MiB, false) == frame_transport::copy_engines);
  // No CTA policies: NCCL's kernels throughout.
  CHECK(choose(a, nvlink_no_cta, 4, 4, 1024 * MiB, true) == frame_transport::nccl_symmetric);
  CHECK(tr::reported(tr::resolve(tr::default_policy(), a, nvlink_no_cta, 4)) ==
        frame_transport::nccl_symmetric);
}

TEST_CASE("automatic, 8-bit codes over NVLink: peer stores below 32 MiB, copy engines above") {
  const auto a = frame_transport::automatic;
  CHECK(tr::reported(tr::resolve(tr::default_policy(), a, nvlink, 8)) ==
        frame_transport::copy_engines);
  for (bool overlapped : {true, false}) {
    CHECK(choose(a, nvlink, 8, 8, 1 * KiB, overlapped) == frame_transport::peer_stores);
    CHECK(choose(a, nvlink, 8, 8, 10 * MiB, overlapped) == frame_transport::peer_stores);
    CHECK(choose(a, nvlink, 8, 8, 32 * MiB - 1, overlapped) == frame_transport::peer_stores);
    CHECK(choose(a, nvlink, 8, 8, 32 * MiB, overlapped) == frame_transport::copy_engines);
  }
  // A run-time width up to 8 bits calling at 4: the narrow codes' thresholds.
  CHECK(choose(a, nvlink, 8, 4, 10 * MiB, true) == frame_transport::copy_engines);
  CHECK(choose(a, nvlink, 8, 4, 1 * MiB, true) == frame_transport::nccl_symmetric);
  // No CTA policies: peer stores at every size.
  CHECK(choose(a, nvlink_no_cta, 8, 8, 1024 * MiB, true) == frame_transport::peer_stores);
  CHECK(tr::reported(tr::resolve(tr::default_policy(), a, nvlink_no_cta, 8)) ==
        frame_transport::peer_stores);
}

TEST_CASE("automatic where the peers are not mapped: NCCL's kernels on the windows") {
  const auto a = frame_transport::automatic;
  for (const tr::support& s : {pcie_no_p2p, nccl_2_27}) {
    CHECK(tr::reported(tr::resolve(tr::default_policy(), a, s, 8)) ==
          frame_transport::nccl_symmetric);
    CHECK(choose(a, s, 8, 8, 1024 * MiB, true) == frame_transport::nccl_symmetric);
    CHECK(choose(a, s, 4, 4, 1024 * MiB, false) == frame_transport::nccl_symmetric);
  }
}

TEST_CASE("peer_stores: every width and size where the peers are load/store accessible") {
  const auto t = frame_transport::peer_stores;
  CHECK(tr::reported(tr::resolve(tr::default_policy(), t, nvlink, 1)) ==
        frame_transport::peer_stores);
  for (int bits : {1, 2, 4, 8})
    for (std::size_t slot : {std::size_t{1}, 32 * MiB, 1024 * MiB})
      CHECK(choose(t, nvlink, bits, bits, slot, true) == frame_transport::peer_stores);
  CHECK(choose(t, pcie_no_p2p, 8, 8, 1 * MiB, true) == frame_transport::nccl_symmetric);
  CHECK(tr::reported(tr::resolve(tr::default_policy(), t, pcie_no_p2p, 8)) ==
        frame_transport::nccl_symmetric);
}

TEST_CASE("copy_engines: every all-gather where NCCL has CTA policies") {
  const auto t = frame_transport::copy_engines;
  for (const tr::support& s : {nvlink, pcie_no_p2p}) {  // asked for: no mapping needed
    CHECK(tr::reported(tr::resolve(tr::default_policy(), t, s, 8)) ==
          frame_transport::copy_engines);
    for (bool overlapped : {true, false}) {
      CHECK(choose(t, s, 8, 8, 1, overlapped) == frame_transport::copy_engines);
      CHECK(choose(t, s, 4, 4, 1, overlapped) == frame_transport::copy_engines);
    }
  }
  CHECK(choose(t, nccl_2_27, 4, 4, 1024 * MiB, true) == frame_transport::nccl_symmetric);
}

TEST_CASE("a policy of one's own moves the thresholds") {
  const auto a = frame_transport::automatic;
  tr::policy p = tr::default_policy();
  p.copy_engine_min_bytes = 64 * KiB;  // what collective_nccl_test uses
  CHECK(choose(a, nvlink, 4, 4, 64 * KiB, true, p) == frame_transport::copy_engines);
  CHECK(choose(a, nvlink, 4, 4, 64 * KiB - 1, true, p) == frame_transport::nccl_symmetric);
  CHECK(choose(a, nvlink, 8, 8, 64 * KiB, true, p) == frame_transport::peer_stores);
  p.peer_store_min_bits = 4;
  CHECK(choose(a, nvlink, 4, 4, 64 * KiB, true, p) == frame_transport::peer_stores);
  CHECK(choose(a, nvlink, 4, 2, 64 * KiB, true, p) == frame_transport::copy_engines);
  p.peer_store_min_bits = 9;  // wider than any code: no device communicator is made
  CHECK_FALSE(tr::resolve(p, a, nvlink, 8).peer_stores);
  CHECK(tr::reported(tr::resolve(p, a, nvlink, 8)) == frame_transport::copy_engines);
}

TEST_CASE("resolve and choose reproduce the NCCL backend's former decisions exactly") {
  tr::policy custom{3 * MiB, 5 * MiB, 2, 16};
  const std::size_t slots[] = {0,
                               1,
                               64 * KiB,
                               3 * MiB,
                               5 * MiB - 1,
                               5 * MiB,
                               10 * MiB - 1,
                               10 * MiB,
                               32 * MiB - 1,
                               32 * MiB,
                               1024 * MiB};
  int cases = 0;
  for (const tr::policy& p : {tr::default_policy(), custom})
    for (const auto t : lowbit::all_frame_transports)
      for (int bitsmask = 0; bitsmask < 16; ++bitsmask) {
        const tr::support s{(bitsmask & 1) != 0, (bitsmask & 2) != 0, (bitsmask & 4) != 0,
                            (bitsmask & 8) != 0};
        for (int widest : {1, 2, 4, 8, 16}) {
          const reference ref(p, t, s, widest);
          const tr::setup got = tr::resolve(p, t, s, widest);
          INFO(tr::to_string(p) << " " << lowbit::to_string(t) << " support " << bitsmask
                                << " widest " << widest);
          CHECK(tr::reported(got) == ref.transport());
          for (int bits = 1; bits <= widest; bits *= 2)
            for (std::size_t slot : slots)
              for (bool overlapped : {true, false}) {
                ++cases;
                if (tr::choose(got, bits, slot, overlapped) !=
                    ref.allgather(bits, slot, overlapped))
                  FAIL_CHECK("bits " << bits << " slot " << slot << " overlapped " << overlapped);
              }
        }
      }
  CHECK(cases > 10000);
}
