// The node backend's host-side decisions, on any machine (no GPU needed): whether a group of
// ranks, each as it described itself at the bootstrap, can form a node_comm, and the layout
// of the transfer kernels' flag window.
#include <catch2/catch.hpp>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "lowbit/comm/node_comm.hpp"
#include "lowbit/transport/ipc/ipc_mover.cuh"

namespace {

using lowbit::comm::node_group_problem;
using lowbit::comm::node_rank_info;

/// P ranks on host "h", one process each, `gpus` GPUs dealt round-robin.
std::vector<node_rank_info> group(int P, int gpus) {
  std::vector<node_rank_info> g(static_cast<std::size_t>(P));
  for (int p = 0; p < P; ++p) {
    node_rank_info& r = g[static_cast<std::size_t>(p)];
    std::strcpy(r.host, "h");
    r.pid = 1000 + p;
    r.rank = p;
    r.size = P;
    r.device = p % gpus;
    r.uuid.bytes[0] = static_cast<char>(p % gpus);
  }
  return g;
}

const auto reachable = [](int) { return std::string(); };

}  // namespace

TEST_CASE("node_group_problem: a node of processes on one or several GPUs forms a group") {
  for (int P : {1, 2, 3, 8})
    for (int gpus : {1, 2, 8}) {
      const auto g = group(P, gpus);
      for (int me = 0; me < P; ++me) CHECK(node_group_problem(g, me, reachable).empty());
    }
}

TEST_CASE("node_group_problem: peer access is asked only across GPUs, and its refusal named") {
  const auto g = group(4, 2);  // ranks 0, 2 on GPU 0; 1, 3 on GPU 1
  std::set<int> asked;
  CHECK(node_group_problem(g, 0, [&](int p) {
          asked.insert(p);
          return std::string();
        }).empty());
  CHECK(asked == std::set<int>{1, 3});
  const std::string why = node_group_problem(
      g, 0, [](int p) { return p == 3 ? std::string("no P2P") : std::string(); });
  CHECK(why == "rank 3: no P2P");
}

TEST_CASE("node_group_problem: ranks on two hosts, one process twice, a wrong rank or size") {
  auto hosts = group(3, 1);
  std::strcpy(hosts[2].host, "other");
  const std::string h = node_group_problem(hosts, 0, reachable);
  CHECK(h.find("not on one node") != std::string::npos);
  CHECK(h.find("'other'") != std::string::npos);

  auto twice = group(3, 1);
  twice[1].pid = twice[0].pid;
  CHECK(node_group_problem(twice, 0, reachable).find("one process per rank") != std::string::npos);

  auto wrong = group(3, 1);
  wrong[2].size = 4;
  CHECK(node_group_problem(wrong, 1, reachable).find("rank 2 says it is rank 2 of 4") !=
        std::string::npos);
}

TEST_CASE("the flag window: one flag per phase, CTA and sender, then this rank's counters") {
  using lowbit::transport::ipc_flag_bytes;
  using lowbit::transport::ipc_flag_index;
  for (int P : {2, 3, 8, lowbit::comm::node_max_ranks}) {
    const int ctas = lowbit::transport::ipc_mover::ctas;
    std::set<std::size_t> seen;
    for (int phase = 0; phase < 2; ++phase)
      for (int c = 0; c < ctas; ++c)
        for (int from = 0; from < P; ++from) seen.insert(ipc_flag_index(phase, c, from, P, ctas));
    CHECK(seen.size() == static_cast<std::size_t>(2 * ctas * P));   // no two share a flag
    CHECK(*seen.rbegin() + 1 == ipc_flag_index(2, 0, 0, P, ctas));  // counters after them
    CHECK(ipc_flag_bytes(P, ctas) ==
          sizeof(unsigned long long) * (static_cast<std::size_t>(2 * P + 1) * ctas));
  }
}
