// The hierarchical collectives on the host (MPI) backend, over node shapes built on one
// host: every N x G = P with N, G >= 2, nodes of contiguous and of interleaved ranks.
// Checked against a host simulation (bit for bit), the fp64 sum (within the bound of the
// inter codec's two quantizations plus stage-1 rounding) and the other ranks.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "collective_test_util.hpp"
#include "lowbit/collective/mpi.hpp"

namespace lowbit::test {
namespace {

using C4n = codec<quant::absmax<4, 128>, round::nearest>;
using C2s = codec<quant::absmax<2, 64>, round::stochastic>;
using C8n = codec<quant::absmax<8, 128>, round::nearest>;
using C4s = codec<quant::absmax<4, 128>, round::stochastic>;
using Res = feedback::residual<>;

const comm::mpi_comm& world() {
  static const comm::mpi_comm c(MPI_COMM_WORLD);
  return c;
}

/// Every (nodes, ranks per node) with both at least 2 whose product is the world size.
std::vector<std::pair<int, int>> shapes() {
  std::vector<std::pair<int, int>> s;
  for (int g = 2; g <= world_size() / 2; ++g)
    if (world_size() % g == 0) s.push_back({world_size() / g, g});
  return s;
}

/// The node of world rank r: contiguous blocks of G ranks, or interleaved (r mod N).
int node_of(int r, int N, int G, bool interleaved) { return interleaved ? r % N : r / G; }

std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t stage, std::uint64_t key) {
  return seed ^ ((stage * 0x9e3779b97f4a7c15ull) + (key + 1) * 0xbf58476d1ce4e5b9ull);
}

/// One simulated rank of a rail: its residual (if any).
struct sim_rank {
  feedback::state<Res, lowbit::detail::host_buffer> state;
};

/// The flat all_reduce of `xs` (one shard per node) with classic error feedback when
/// `ef`, as the engine computes it: one_shot on two nodes, two_phase above.
template <class Codec>
std::vector<float> simulate_rail(const std::vector<std::vector<float>>& xs, std::size_t count,
                                 std::uint64_t seed, std::uint32_t step, float scale, bool ef,
                                 std::vector<sim_rank>& st) {
  const int N = static_cast<int>(xs.size());
  std::vector<float> out(count);
  const auto fb = [&](int p, std::size_t off) { return st[p].state.worker_ref().shifted(off); };
  if (N == 2) {
    const std::size_t fbytes = Codec::frame_bytes(count);
    lowbit::detail::host_buffer<std::byte> frames(fbytes * N);
    std::vector<float> acc(count, 0.0f);
    for (int p = 0; p < N; ++p) {
      const span<std::byte> f(frames.data() + p * fbytes, fbytes);
      const rng_key k{seed, step, static_cast<std::uint32_t>(p), 0};
      if (ef)
        host::encode<Codec>(span<const float>(xs[p].data(), count), f, k, 0, fb(p, 0));
      else
        host::encode<Codec>(span<const float>(xs[p].data(), count), f, k, 0);
    }
    for (int p = 0; p < N; ++p)
      host::decode_accumulate<Codec>(span<const std::byte>(frames.data() + p * fbytes, fbytes),
                                     span<float>(acc.data(), count));
    for (std::size_t i = 0; i < count; ++i) out[i] = scale != 1.0f ? acc[i] * scale : acc[i];
    return out;
  }
  for (int q = 0; q < N; ++q) {
    const auto s = schedule::shard(count, Codec::block_size, N, q);
    if (s.count == 0) continue;
    const std::size_t fbytes = Codec::frame_bytes(s.count);
    lowbit::detail::host_buffer<std::byte> frames(fbytes * N), red(fbytes);
    lowbit::detail::host_buffer<float> acc(s.count);
    for (int p = 0; p < N; ++p) {
      const span<std::byte> f(frames.data() + p * fbytes, fbytes);
      const span<const float> x(xs[p].data() + s.begin, s.count);
      const rng_key k{seed, step, static_cast<std::uint32_t>(p), 0};
      if (ef)
        host::encode<Codec>(x, f, k, s.begin, fb(p, s.begin));
      else
        host::encode<Codec>(x, f, k, s.begin);
    }
    host::decode_accumulate_encode<Codec>(
        frames.data(), fbytes, N, span<float>(acc.data(), s.count),
        span<std::byte>(red.data(), fbytes), rng_key{seed, step, static_cast<std::uint32_t>(q), 1},
        s.begin);
    host::decode<Codec>(span<const std::byte>(red.data(), fbytes),
                        span<float>(out.data() + s.begin, s.count), scale);
  }
  return out;
}

/// The whole hierarchical all_reduce in one process: stage 1's rank-order fp32 node
/// sums, stage 2 per rail, stage 3 a copy. `rails[l]` holds rail l's simulated ranks.
template <class Codec>
std::vector<float> simulate(const std::vector<std::vector<float>>& xs, int N, int G,
                            bool interleaved, std::size_t count, std::uint64_t seed,
                            std::uint32_t step, reduce_op op, bool ef,
                            std::vector<std::vector<sim_rank>>& rails) {
  const float sG = op == reduce_op::avg ? 1.0f / static_cast<float>(G) : 1.0f;
  const float sN = op == reduce_op::avg ? 1.0f / static_cast<float>(N) : 1.0f;
  std::vector<std::vector<int>> members(static_cast<std::size_t>(N));  // world ranks, in order
  for (int r = 0; r < N * G; ++r) members[node_of(r, N, G, interleaved)].push_back(r);
  std::vector<float> out(count);
  for (int l = 0; l < G; ++l) {
    const auto sh = schedule::shard(count, Codec::block_size, G, l);
    std::vector<std::vector<float>> shards(static_cast<std::size_t>(N));
    for (int n = 0; n < N; ++n) {
      std::vector<float> acc(sh.count, 0.0f);
      for (int r : members[n])
        for (std::size_t j = 0; j < sh.count; ++j)
          acc[j] = lowbit::detail::fadd(acc[j], xs[r][sh.begin + j]);
      for (auto& v : acc) v = sG != 1.0f ? lowbit::detail::fmul(v, sG) : v;
      shards[n] = std::move(acc);
    }
    const auto red =
        simulate_rail<Codec>(shards, sh.count, mix_seed(seed, 2, l), step, sN, ef, rails[l]);
    std::copy(red.begin(), red.end(), out.begin() + sh.begin);
  }
  return out;
}

/// Chunks small enough that a few thousand values make several: the pipelined path.
using chunked = schedule::pipelined<4, 1>;
using ramped = schedule::ramped<4, 1>;

/// Runs `steps` calls of one hierarchical all_reduce on shape N x G and checks each. The
/// simulation does not cut chunks: stage 2's chunks encode the same blocks with the same
/// keys and feedback slots, so a chunked call computes the same bits.
template <class Codec, class Feedback, class Schedule = schedule::flat>
void check_shape(int N, int G, bool interleaved, std::size_t count, reduce_op op, int steps,
                 std::uint64_t salt) {
  INFO(N << " nodes x " << G << (interleaved ? " (interleaved)" : " (contiguous)") << ", count "
         << count << ", " << Codec::bits << " bits, " << Feedback::name << ", " << Schedule::name);
  const int me = world_rank(), P = world_size();
  const auto nc = comm::split_by_node(world(), node_of(me, N, G, interleaved) * 7 + 3);
  REQUIRE(nc.nodes == N);
  REQUIRE(nc.ranks_per_node == G);
  REQUIRE(nc.node == node_of(me, N, G, interleaved));
  collective_options o;
  o.op = op;
  o.seed = shared_seed() + salt;
  mpi::hierarchical_all_reduce<float, Codec, Feedback, full_precision, Schedule> reduce(
      nc.intra, nc.inter, 20000, o);
  constexpr bool ef = !std::is_same_v<Feedback, feedback::none>;
  std::vector<std::vector<sim_rank>> rails(static_cast<std::size_t>(G));
  for (int l = 0; l < G; ++l)
    for (int n = 0; n < N; ++n)
      rails[l].push_back({feedback::state<Res, lowbit::detail::host_buffer>(20000, 0)});
  const double scale = op == reduce_op::avg ? 1.0 / P : 1.0;
  for (int s = 0; s < steps; ++s) {
    std::vector<std::vector<float>> xs;
    std::vector<std::vector<double>> xd;
    std::vector<double> exact(count, 0.0);
    for (int p = 0; p < P; ++p) {
      xs.push_back(make_input(input_kind::normal, count, p, salt * 31 + s));
      xd.push_back(to_double(xs.back()));
      for (std::size_t i = 0; i < count; ++i) exact[i] += xd.back()[i] * scale;
    }
    const std::uint32_t step = reduce.step();
    std::vector<float> out(count);
    reduce(xs[me].data(), out.data(), count);
    CHECK(reduce.step() == step + 1);
    const auto sim = simulate<Codec>(xs, N, G, interleaved, count, o.seed, step, op, ef, rails);
    CHECK(std::memcmp(sim.data(), out.data(), count * sizeof(float)) == 0);
    CHECK(same_on_all_ranks(out.data(), count * sizeof(float)));
    if (!ef) {  // feedback moves the output by the carried residual: bound the plain case
      // N node sums quantized twice; the node sums' own fp32 rounding is in the slack.
      std::vector<std::vector<double>> node_sums(static_cast<std::size_t>(N),
                                                 std::vector<double>(count, 0.0));
      for (int p = 0; p < P; ++p)
        for (std::size_t i = 0; i < count; ++i)
          node_sums[node_of(p, N, G, interleaved)][i] += xd[p][i] * scale * N;
      CHECK(worst_ratio(out, exact, error_bound<Codec>(node_sums, N > 2, 1.0 / N)) <= 1.0);
    }
  }
}

TEST_CASE(
    "hierarchical_all_reduce: every node shape, equal to the host simulation and within "
    "the bound of fp64") {
  std::uint64_t salt = 1;
  for (const auto& [N, G] : shapes())
    for (const bool interleaved : {false, true})
      for (const std::size_t count : {std::size_t(1), std::size_t(200), std::size_t(4099)}) {
        check_shape<C4n, feedback::none>(N, G, interleaved, count, reduce_op::sum, 1, salt++);
        check_shape<C2s, feedback::none>(N, G, interleaved, count, reduce_op::avg, 1, salt++);
      }
}

TEST_CASE("hierarchical_all_reduce: error feedback over several steps") {
  std::uint64_t salt = 1000;
  for (const auto& [N, G] : shapes())
    check_shape<C2s, Res>(N, G, true, 10007, reduce_op::sum, 3, salt++);
}

TEST_CASE(
    "hierarchical_all_reduce: chunked stages (pipelined and ramped) compute the host "
    "simulation's bits") {
  std::uint64_t salt = 2000;
  for (const auto& [N, G] : shapes())
    for (const std::size_t count : {std::size_t(200), std::size_t(4099), std::size_t(10007)}) {
      check_shape<C4n, feedback::none, chunked>(N, G, false, count, reduce_op::sum, 1, salt++);
      check_shape<C2s, feedback::none, ramped>(N, G, true, count, reduce_op::avg, 1, salt++);
    }
  for (const auto& [N, G] : shapes())
    check_shape<C2s, Res, chunked>(N, G, true, 10007, reduce_op::sum, 3, salt++);
}

TEST_CASE(
    "hierarchical_all_reduce: a count under max_count whose last rail shard is larger than "
    "at max_count") {
  // Blocks are dealt with the remainder to the first ranks: at 257 values of 2 ranks per
  // node, local rank 1 holds 1 value; at 256 it holds 128. Buffers sized by this rank's
  // shard of max_count overflowed.
  for (const auto& [N, G] : shapes()) {
    const int me = world_rank();
    const auto nc = comm::split_by_node(world(), node_of(me, N, G, false));
    const std::size_t max_count = 128 * static_cast<std::size_t>(G) + 1;
    mpi::hierarchical_all_reduce<float, C4n> reduce(nc.intra, nc.inter, max_count);
    for (const std::size_t count : {max_count, max_count - 1, std::size_t(129)}) {
      const auto x = make_input(input_kind::normal, count, me, 91);
      std::vector<float> out(count);
      reduce(x.data(), out.data(), count);
      CHECK(same_on_all_ranks(out.data(), count * sizeof(float)));
    }
  }
}

TEST_CASE("hierarchical_all_reduce: a stochastic intra codec gives every node the same bits") {
  // Stage 3 re-encodes the rail's result, identical on every node: its noise must not
  // depend on the node.
  for (const auto& [N, G] : shapes()) {
    const int me = world_rank();
    const auto nc = comm::split_by_node(world(), node_of(me, N, G, true));
    mpi::hierarchical_all_reduce<float, C4n, feedback::none, C4s, schedule::flat> reduce(
        nc.intra, nc.inter, 5000);
    const std::size_t count = 4099;
    const auto x = make_input(input_kind::normal, count, me, 78);
    std::vector<float> out(count);
    reduce(x.data(), out.data(), count);
    CHECK(same_on_all_ranks(out.data(), count * sizeof(float)));
  }
}

TEST_CASE(
    "hierarchical_all_reduce: an 8-bit intra codec, within the bound and identical on all "
    "ranks") {
  for (const auto& [N, G] : shapes()) {
    const int me = world_rank();
    const auto nc = comm::split_by_node(world(), node_of(me, N, G, true));
    mpi::hierarchical_all_reduce<float, C4n, feedback::none, C8n, schedule::flat> reduce(
        nc.intra, nc.inter, 5000);
    const std::size_t count = 4099;
    const auto x = make_input(input_kind::normal, count, me, 77);
    std::vector<float> out(count);
    reduce(x.data(), out.data(), count);
    std::vector<double> exact(count, 0.0);
    double amax = 0;
    for (int p = 0; p < world_size(); ++p) {
      const auto xp = make_input(input_kind::normal, count, p, 77);
      for (std::size_t i = 0; i < count; ++i) exact[i] += xp[i];
    }
    for (double v : exact) amax = std::max(amax, std::abs(v));
    double worst = 0;
    for (std::size_t i = 0; i < count; ++i) worst = std::max(worst, std::abs(out[i] - exact[i]));
    // A loose bound: 4-bit steps of the node sums, twice, plus the 8-bit intra stages.
    CHECK(worst <= 2.0 * step_for<C4n>(amax * 2) * N);
    CHECK(same_on_all_ranks(out.data(), count * sizeof(float)));
  }
}

TEST_CASE("hierarchical_reduce_scatter: this rank's part of the hierarchical all_reduce's sum") {
  for (const auto& [N, G] : shapes()) {
    const int me = world_rank(), P = world_size();
    const auto nc = comm::split_by_node(world(), node_of(me, N, G, false));
    collective_options o;
    o.seed = shared_seed() + 5;
    mpi::hierarchical_reduce_scatter<float, C4n, feedback::none, full_precision, schedule::flat> rs(
        nc.intra, nc.inter, 5000, o);
    for (const std::size_t count : {std::size_t(3), std::size_t(4099)}) {
      const auto x = make_input(input_kind::normal, count, me, 91);
      const schedule::range mine = rs.shard(count);
      std::vector<float> out(mine.count + 1);
      rs(x.data(), out.data(), count);
      // The parts tile the tensor: their sizes add up to count over every rank.
      unsigned long long total = mine.count, all = 0;
      MPI_Allreduce(&total, &all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
      CHECK(all == count);
      std::vector<std::vector<double>> node_sums(static_cast<std::size_t>(N),
                                                 std::vector<double>(count, 0.0));
      std::vector<double> exact(count, 0.0);
      for (int p = 0; p < P; ++p) {
        const auto xp = make_input(input_kind::normal, count, p, 91);
        for (std::size_t i = 0; i < count; ++i) {
          node_sums[node_of(p, N, G, false)][i] += xp[i];
          exact[i] += xp[i];
        }
      }
      const auto bound = error_bound<C4n>(node_sums, false, 1.0);
      std::vector<float> got(out.begin(), out.begin() + mine.count);
      CHECK(worst_ratio(
                got, std::vector<double>(exact.begin() + mine.begin, exact.begin() + mine.end()),
                std::vector<double>(bound.begin() + mine.begin, bound.begin() + mine.end())) <=
            1.0);
    }
  }
}

TEST_CASE("hierarchical_reduce_scatter: chunked stages give the one-pass call's bits") {
  for (const auto& [N, G] : shapes()) {
    const int me = world_rank();
    const auto nc = comm::split_by_node(world(), node_of(me, N, G, true));
    collective_options o;
    o.seed = shared_seed() + 9;
    mpi::hierarchical_reduce_scatter<float, C2s, Res, full_precision, schedule::flat> flat(
        nc.intra, nc.inter, 12000, o);
    mpi::hierarchical_reduce_scatter<float, C2s, Res, full_precision, chunked> piped(
        nc.intra, nc.inter, 12000, o);
    for (int s = 0; s < 2; ++s)
      for (const std::size_t count : {std::size_t(300), std::size_t(11111)}) {
        INFO(N << " x " << G << ", count " << count << ", step " << s);
        const auto x = make_input(input_kind::normal, count, me, 131 + s);
        REQUIRE(flat.shard(count).begin == piped.shard(count).begin);
        const std::size_t n = flat.shard(count).count;
        std::vector<float> a(n + 1), b(n + 1);
        flat(x.data(), a.data(), count);
        piped(x.data(), b.data(), count);
        CHECK(std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0);
      }
  }
}

TEST_CASE(
    "hierarchical_all_reduce: a rank whose count differs raises agreement_error on every "
    "rank, before data moves, and the object stays usable") {
  for (const auto& [N, G] : shapes()) {
    const int me = world_rank();
    const auto nc = comm::split_by_node(world(), node_of(me, N, G, true));
    collective_options o;
    o.timeout = std::chrono::seconds(20);
    mpi::hierarchical_all_reduce<float, C4n, feedback::none, full_precision, schedule::flat> reduce(
        nc.intra, nc.inter, 1000, o);
    std::vector<float> x(1000, 1.0f), out(1000, -1.0f);
    const std::size_t count = me == world_size() - 1 ? 999 : 1000;
    CHECK_THROWS_AS(reduce(x.data(), out.data(), count), agreement_error);
    CHECK(out[0] == -1.0f);  // nothing written
    reduce(x.data(), out.data(), 1000);
    CHECK(out[0] == static_cast<float>(world_size()));
  }
}

TEST_CASE(
    "hierarchical_all_reduce: a rank whose rail communicator is unusable throws before it "
    "sends anything; the others time out in the agreement, not in a stage, with both "
    "communicators marked") {
  // Stage 2's collective checks the rail, but only after stage 1 has run: the rank threw
  // there, having sent its stage-1 frames, and its peers waited for its stage-2 and stage-3
  // frames, each with one communicator marked unusable.
  using namespace std::chrono_literals;
  for (const auto& [N, G] : shapes()) {
    const int me = world_rank();
    const auto nc = comm::split_by_node(world(), node_of(me, N, G, false));
    collective_options o;
    o.timeout = 1000ms;
    mpi::hierarchical_all_reduce<float, C4n, feedback::none, full_precision, schedule::flat> reduce(
        nc.intra, nc.inter, 1000, o);
    if (me == 0) nc.inter.mark_unusable("a test: rank 0's rail failed");
    std::vector<float> x(1000, 1.0f), out(1000, -1.0f);
    std::string what;
    int kind = 0;  // 0 returned, 1 invalid_argument, 2 timeout_error, 3 another error
    const auto t0 = std::chrono::steady_clock::now();
    try {
      reduce(x.data(), out.data(), 1000);
    } catch (const invalid_argument& e) {
      kind = 1;
      what = e.what();
    } catch (const timeout_error& e) {
      kind = 2;
      what = e.what();
    } catch (const std::exception& e) {
      kind = 3;
      what = e.what();
    }
    INFO(N << " x " << G << ": " << what);
    CHECK(std::chrono::steady_clock::now() - t0 < 15s);
    CHECK(out[0] == -1.0f);  // nothing written
    if (me == 0) {
      CHECK(kind == 1);
      CHECK(what.find("unusable") != std::string::npos);
    } else {
      CHECK(kind == 2);
      CHECK(what.find("fingerprint") != std::string::npos);  // the agreement's wait
      CHECK(nc.intra.unusable());
      CHECK(nc.inter.unusable());
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("split_by_node: a rank that never calls makes the others time out, not hang") {
  using namespace std::chrono_literals;
  // A communicator of its own: the timeout marks it unusable.
  const comm::mpi_comm mine = comm::mpi_comm::duplicate(MPI_COMM_WORLD);
  const bool absent = world_rank() == world_size() - 1;
  int kind = 0;  // 0 returned (or never called), 1 timeout_error, 2 another error
  std::string what;
  const auto t0 = std::chrono::steady_clock::now();
  if (!absent) {
    try {
      comm::split_by_node(mine, world_rank() / 2, 1000ms);
    } catch (const timeout_error& e) {
      kind = 1;
      what = e.what();
    } catch (const std::exception& e) {
      kind = 2;
      what = e.what();
    }
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  std::vector<int> all(static_cast<std::size_t>(world_size()));
  MPI_Allgather(&kind, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 0; r + 1 < world_size(); ++r) CHECK(all[static_cast<std::size_t>(r)] == 1);
  if (!absent) {
    INFO(what);
    CHECK(took < 30s);  // the 1 s deadline, not forever
    CHECK(what.find("split_by_node") != std::string::npos);
    CHECK(mine.unusable());
    CHECK_THROWS_AS(comm::split_by_node(mine, 0, 1000ms), invalid_argument);  // at once
  } else {
    // The absent rank joins the gather the others abandoned, so nothing stays pending.
    std::vector<int> sink(static_cast<std::size_t>(world_size()) + 1);
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Iallgather(&sink.back(), 1, MPI_INT, sink.data(), 1, MPI_INT, mine.get(), &req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace lowbit::test

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int rank = lowbit::test::world_rank();
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) rc = session.run();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && worst != 0) std::fprintf(stderr, "some rank failed (%d)\n", worst);
  MPI_Finalize();
  return worst;
}
