// The hierarchical all-reduce's time model (lowbit/qsync/comm_model.hpp): its chunks are the
// collective's, its NCCL time overlaps them as the two streams do, its MPI time runs them in
// turn.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "lowbit/qsync/comm_model.hpp"
#include "lowbit/qsync/device_profile.hpp"
#include "lowbit/qsync/simulator.hpp"
#include "lowbit/schedule/schedule.hpp"
#include "qsync_fixtures.hpp"

using namespace lowbit::qsync;
using Catch::Matchers::Contains;

namespace {

hierarchical_stages stages_of(std::vector<double> rs, std::vector<double> rail,
                              std::vector<double> ag) {
  hierarchical_stages st;
  st.reduce_scatter = std::move(rs);
  st.rail = std::move(rail);
  st.all_gather = std::move(ag);
  return st;
}

/// The chunks hierarchical_all_reduce<..., Schedule> runs a call in, computed from
/// lowbit::schedule itself as hierarchical.hpp and engine.hpp do: the most of any rank's
/// stage 2 (one-shot on two nodes), one with one node or one rank per node.
template <class Schedule>
int library_chunks(std::size_t count, int nodes, int per_node) {
  if (count == 0 || nodes == 1 || per_node == 1) return 1;
  int K = 1;
  for (int p = 0; p < per_node; ++p) {
    const std::size_t n = lowbit::schedule::shard(count, 128, per_node, p).count;
    if (n == 0) continue;
    K = std::max(K, lowbit::schedule::num_chunks<Schedule>(n, 128, nodes == 2 ? 1 : nodes));
  }
  return K;
}

template <class Schedule>
void check_chunks_match(const std::string& name) {
  const comm_schedule s = builtin_schedule(name);
  const std::size_t counts[] = {0,         1,         127,        4096,         1000003,
                                6553600,   33554432,  67108864,   134217731,    268435456,
                                536870912, 805306368, 1073741824, 4294967296ull};
  for (std::size_t count : counts)
    for (int nodes : {1, 2, 3, 4, 8, 16})
      for (int per_node : {1, 2, 3, 8}) {
        INFO(name << " count " << count << " nodes " << nodes << " per node " << per_node);
        CHECK(hierarchical_chunks(static_cast<double>(count), nodes, per_node, s) ==
              library_chunks<Schedule>(count, nodes, per_node));
      }
}

}  // namespace

TEST_CASE("hierarchical_chunks cuts a call as the collective does, for every built-in schedule") {
  using namespace lowbit::schedule;
  check_chunks_match<default_schedule>("default");
  check_chunks_match<flat>("flat");
  check_chunks_match<pipelined<>>("pipelined");
  check_chunks_match<pipelined<2, (std::size_t{1} << 20)>>("pipelined2");
  check_chunks_match<pipelined<4, (std::size_t{1} << 20)>>("pipelined4");
  check_chunks_match<pipelined<8, (std::size_t{1} << 20)>>("pipelined8");
  check_chunks_match<pipelined<16, (std::size_t{1} << 20)>>("pipelined16");
  check_chunks_match<ramped<8, (std::size_t{1} << 23)>>("ramped23");
  // A coded node-local stage runs whole: one chunk whatever the schedule.
  CHECK(hierarchical_chunks(1073741824.0, 4, 8, builtin_schedule("pipelined4"), 8) == 1);
  // A DDP bucket (25 MB of fp32) is one chunk under the default schedule: no overlap.
  CHECK(hierarchical_chunks(6553600.0, 4, 8) == 1);
  CHECK(hierarchical_chunks(6553600.0, 2, 8) == 1);
}

TEST_CASE("chunk_share follows the schedule's ramp weights and sums to one") {
  const comm_schedule ramp = builtin_schedule("default"), even = builtin_schedule("pipelined4");
  for (int K = 1; K <= 8; ++K) {
    double r = 0, e = 0;
    for (int k = 0; k < K; ++k) {
      CHECK(chunk_share(ramp, K, k) == Approx(double(lowbit::schedule::ramp_weight(K, k)) /
                                              double(lowbit::schedule::ramp_total(K))));
      CHECK(chunk_share(even, K, k) == Approx(1.0 / K));
      r += chunk_share(ramp, K, k);
      e += chunk_share(even, K, k);
    }
    CHECK(r == Approx(1.0));
    CHECK(e == Approx(1.0));
  }
}

TEST_CASE("pipelined stages: hand-computed timelines of the two streams") {
  // One chunk: nothing to overlap, the stages add up.
  const auto one = stages_of({1.5}, {2.0}, {0.5});
  CHECK(one.pipelined_ms() == Approx(4.0));
  CHECK(one.sum_ms() == Approx(4.0));
  // Stage 2 the bottleneck: RS0 [0,1] RS1 [1,2]; rail0 [1,4] rail1 [4,7]; AG0 [4,5] AG1 [7,8]:
  // fill (RS0) + 2 x rail + drain (AG1).
  const auto rail_bound = stages_of({1, 1}, {3, 3}, {1, 1});
  CHECK(rail_bound.pipelined_ms() == Approx(8.0));
  CHECK(rail_bound.sum_ms() == Approx(10.0));
  // The node-local stages the bottleneck: they share the caller's stream, so RS0 RS1 AG0 AG1
  // run back to back [0,8] and the rails [2,3] and [4,5] hide behind them.
  const auto local_bound = stages_of({2, 2}, {1, 1}, {2, 2});
  CHECK(local_bound.pipelined_ms() == Approx(8.0));
  CHECK(local_bound.slowest_stage_ms() == Approx(4.0));
  // Unequal (ramped) chunks: RS [0,1] [1,3] [3,4]; rails [1,2] [3,7] [7,8]; AG [4,5] [7,9]
  // [9,10].
  const auto ramp = stages_of({1, 2, 1}, {1, 4, 1}, {1, 2, 1});
  CHECK(ramp.pipelined_ms() == Approx(10.0));
  CHECK(ramp.sum_ms() == Approx(14.0));
}

TEST_CASE("hierarchical_all_reduce_ms: a hand-computed two-chunk call on NCCL and on MPI") {
  // 2^20 fp32 values on 4 nodes of 2 ranks, both links 1 GB/s (1e6 B/ms) and 0.01 ms a step,
  // two equal chunks of at least one value: each rank's shard is 2^19 values, each chunk's
  // piece 2^18 (1 MiB in fp32).
  const link_profile l{"l", 1.0, 0.01};
  const device_profile dev = h200();  // fp32: no codec time
  const comm_schedule two{"two", 2, 1.0, false};
  const double count = 1048576.0;
  REQUIRE(hierarchical_chunks(count, 4, 2, two) == 2);
  // A chunk of stage 1 or 3: 1 latency + 1 MiB; of stage 2: 2 x 3 latencies + 2 x 3 frames of
  // 2^16 values (256 KiB).
  const double local = 0.01 + 1048576.0 / 1e6;
  const double rail = 6 * 0.01 + 6 * 262144.0 / 1e6;
  const hierarchical_stages st = hierarchical_stage_ms(32, count, 4, 2, l, l, dev, 32, two);
  REQUIRE(st.chunks() == 2);
  CHECK(st.reduce_scatter[0] == Approx(local));
  CHECK(st.rail[1] == Approx(rail));
  // Stage 2 is the bottleneck: RS0, both rails, AG1.
  CHECK(hierarchical_all_reduce_ms(32, count, 4, 2, l, l, dev, 32, two, comm_backend::nccl) ==
        Approx(local + 2 * rail + local));
  CHECK(hierarchical_all_reduce_ms(32, count, 4, 2, l, l, dev, 32, two, comm_backend::mpi) ==
        Approx(4 * local + 2 * rail));
  // One pass (flat): the stages of the whole shard, on either backend.
  const double one_pass = 2 * (0.01 + 2097152.0 / 1e6) + 6 * 0.01 + 6 * 524288.0 / 1e6;
  for (comm_backend b : {comm_backend::nccl, comm_backend::mpi})
    CHECK(hierarchical_all_reduce_ms(32, count, 4, 2, l, l, dev, 32, builtin_schedule("flat"), b) ==
          Approx(one_pass));
}

TEST_CASE(
    "hierarchical_all_reduce_ms: overlapped is at most the sum and at least the slowest "
    "stage") {
  const device_profile dev = h200();
  const link_profile nv = builtin_link("nvlink4"), ib = builtin_link("ib-ndr"),
                     eth = builtin_link("ethernet-25g");
  int overlapped = 0;
  for (const std::string& name : builtin_schedule_names()) {
    const comm_schedule s = builtin_schedule(name);
    for (double count : {1e3, 1e6, 6553600.0, 33554432.0, 268435456.0, 1073741824.0})
      for (int nodes : {2, 4, 16})
        for (int per_node : {2, 8})
          for (int bits : {2, 4, 8, 16, 32})
            for (const link_profile* inter : {&ib, &eth}) {
              INFO(name << " count " << count << " nodes " << nodes << " per node " << per_node
                        << " bits " << bits << " inter " << inter->name);
              const hierarchical_stages st =
                  hierarchical_stage_ms(bits, count, nodes, per_node, nv, *inter, dev, 32, s);
              const double nccl =
                  hierarchical_all_reduce_ms(bits, count, nodes, per_node, nv, *inter, dev, 32, s);
              const double mpi = hierarchical_all_reduce_ms(bits, count, nodes, per_node, nv,
                                                            *inter, dev, 32, s, comm_backend::mpi);
              CHECK(nccl == Approx(st.pipelined_ms()));
              CHECK(mpi == Approx(st.sum_ms()));
              CHECK(nccl <= mpi * (1 + 1e-12));
              CHECK(nccl >= st.slowest_stage_ms() * (1 - 1e-12));
              // Stage 2 cannot start before the first chunk is staged nor end before the
              // last one's all-gather could start.
              double rail = 0;
              for (double t : st.rail) rail += t;
              CHECK(nccl >=
                    (st.reduce_scatter.front() + rail + st.all_gather.back()) * (1 - 1e-12));
              if (st.chunks() == 1) CHECK(nccl == mpi);
              if (st.chunks() > 1 && nccl < mpi) ++overlapped;
            }
  }
  CHECK(overlapped > 0);  // the sweep does reach calls whose chunks overlap
}

TEST_CASE("hierarchical_all_reduce_ms: one chunk is the one-pass sum of the three stages") {
  const device_profile dev = h200();
  const link_profile nv = builtin_link("nvlink4"), ib = builtin_link("ib-ndr");
  const double n = 6553600.0;  // one chunk under the default schedule
  const double shard = n / 8;
  const double local = 7 * nv.latency_ms + 7 * wire_bytes(32, shard) / (nv.bandwidth_gbs * 1e6);
  CHECK(hierarchical_all_reduce_ms(4, n, 4, 8, nv, ib, dev) ==
        Approx(2 * local + all_reduce_ms(4, shard, 4, ib, dev)));
  // One rank per node: stage 2 alone on the whole tensor; one node: the two local stages.
  CHECK(hierarchical_all_reduce_ms(4, n, 4, 1, nv, ib, dev) == all_reduce_ms(4, n, 4, ib, dev));
  CHECK(hierarchical_all_reduce_ms(4, n, 1, 8, nv, ib, dev) == Approx(2 * local));
  CHECK(hierarchical_all_reduce_ms(4, 0, 4, 8, nv, ib, dev) == 0);
}

TEST_CASE("schedules and backends by name; unknown names are errors that list the choices") {
  CHECK(builtin_schedule("pipelined4").max_chunks == 4);
  CHECK(!builtin_schedule("pipelined4").ramped);
  CHECK(builtin_schedule("default").ramped);
  CHECK(builtin_schedule("default").min_values == double(std::size_t{1} << 24));
  CHECK(parse_comm_backend("mpi") == comm_backend::mpi);
  CHECK(std::string(to_string(comm_backend::nccl)) == "nccl");
  CHECK_THROWS_WITH(builtin_schedule("zigzag"),
                    Contains("unknown schedule 'zigzag'") && Contains("pipelined4"));
  CHECK_THROWS_WITH(parse_comm_backend("gloo"), Contains("unknown backend 'gloo'"));
}

TEST_CASE("simulator: a hierarchical cluster prices its buckets with its schedule and backend") {
  auto ops = test::linear_chain(1);
  ops[0].param_numel = 268435456.0;  // one 1 GiB bucket: four chunks under pipelined4
  const training_model m = test::model_of(ops, 2048.0, 2048.0);
  cluster c{"2x8", {{h200(), 16, {}}}, builtin_link("nvlink4")};
  c.ranks_per_node = 8;
  c.inter_link = builtin_link("ib-ndr");
  c.schedule = builtin_schedule("pipelined4");
  const simulator nccl(m, c);
  c.backend = comm_backend::mpi;
  const simulator mpi(m, c);
  REQUIRE(nccl.buckets().size() == 1);
  const double n = nccl.buckets()[0].numel;
  const link_profile nv = builtin_link("nvlink4"), ib = builtin_link("ib-ndr");
  CHECK(nccl.bucket_ms(0, 0, 4) ==
        hierarchical_all_reduce_ms(4, n, 2, 8, nv, ib, h200(), 32, c.schedule, comm_backend::nccl));
  CHECK(mpi.bucket_ms(0, 0, 4) ==
        hierarchical_all_reduce_ms(4, n, 2, 8, nv, ib, h200(), 32, c.schedule, comm_backend::mpi));
  CHECK(nccl.bucket_ms(0, 0, 4) < mpi.bucket_ms(0, 0, 4));
}
