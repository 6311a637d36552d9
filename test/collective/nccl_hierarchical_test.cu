// The hierarchical collectives on the NCCL backend, one MPI rank per GPU, over every node
// shape N x G of the job (2 GPUs: 2 nodes x 1, the rail path alone, and 1 node x 2; 4
// GPUs add 2 x 2, where the stages pipeline). Checked bit for bit against the host (MPI)
// backend running the same shape on the same inputs: nodes of at most two ranks sum
// exactly in either order, and the codecs are bit-exact host vs device. Also: equal to
// the flat collective on 2 x 1, identical on every rank, and a captured CUDA graph
// replays the eager call.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collective_test_util.hpp"
#include "device_harness.cuh"
#include "lowbit/collective/mpi.hpp"
#include "lowbit/collective/nccl.cuh"
#include "lowbit/comm/mpi_bootstrap.hpp"
#include "mpi_test_main.hpp"

namespace lowbit::test {
namespace {

using C4n = codec<quant::absmax<4, 128>, round::nearest>;
using C2s = codec<quant::absmax<2, 64>, round::stochastic>;
using Res = feedback::residual<>;
/// Chunks small enough that a 10^5-value call is cut: the pipelined path where N, G > 1.
using chunked = schedule::pipelined<4, 4096>;

std::unique_ptr<comm::nccl_comm> g_world;
cudaStream_t g_stream = nullptr;

const comm::mpi_comm& mpi_world() {
  static const comm::mpi_comm c(MPI_COMM_WORLD);
  return c;
}

/// Every (nodes, ranks per node) whose product is the world size, nodes of contiguous
/// ranks.
std::vector<std::pair<int, int>> shapes() {
  std::vector<std::pair<int, int>> s;
  for (int g = 1; g <= world_size(); ++g)
    if (world_size() % g == 0) s.push_back({world_size() / g, g});
  return s;
}

std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t stage, std::uint64_t key) {
  return seed ^ ((stage * 0x9e3779b97f4a7c15ull) + (key + 1) * 0xbf58476d1ce4e5b9ull);
}

/// `steps` calls of the NCCL and the host hierarchical all_reduce on shape N x G: the
/// same bits, on every rank, step after step (the feedback state included).
template <class Codec, class Feedback, class Schedule>
void check_against_host(int N, int G, std::size_t count, int steps, std::uint64_t salt) {
  INFO(N << " nodes x " << G << ", count " << count << ", " << Codec::bits << " bits, "
         << Feedback::name << ", " << Schedule::name);
  const int me = world_rank(), node = me / G;
  const auto nc = comm::split_by_node(*g_world, node);
  const auto mc = comm::split_by_node(mpi_world(), node);
  REQUIRE(nc.nodes == N);
  REQUIRE(nc.ranks_per_node == G);
  collective_options o;
  o.seed = shared_seed() + salt;
  hierarchical_all_reduce<float, Codec, Feedback, full_precision, Schedule> dev(nc.intra, nc.inter,
                                                                                count, o);
  mpi::hierarchical_all_reduce<float, Codec, Feedback, full_precision, Schedule> host(
      mc.intra, mc.inter, count, o);
  dvec<float> d(count);
  for (int s = 0; s < steps; ++s) {
    const auto x = make_input(input_kind::normal, count, me, salt * 17 + s);
    d.from(x);
    dev.async(d.p, d.p, count, g_stream);  // in place
    dev.sync(g_stream);
    std::vector<float> want(count);
    host(x.data(), want.data(), count);
    const auto got = d.get(count);
    CHECK(std::memcmp(got.data(), want.data(), count * sizeof(float)) == 0);
    CHECK(same_on_all_ranks(got.data(), count * sizeof(float)));
    CHECK(dev.step() == host.step());
  }
}

TEST_CASE("hierarchical_all_reduce on NCCL: every node shape, equal to the host backend") {
  std::uint64_t salt = 1;
  for (const auto& [N, G] : shapes()) {
    if (G > 2) continue;  // NCCL sums more than two ranks in an order of its own
    for (const std::size_t count : {std::size_t(1), std::size_t(1000), std::size_t(100003)}) {
      check_against_host<C4n, feedback::none, schedule::flat>(N, G, count, 1, salt++);
      check_against_host<C2s, Res, chunked>(N, G, count, 3, salt++);
    }
  }
}

TEST_CASE("hierarchical_all_reduce on 2 nodes x 1 is the flat all_reduce of the rail") {
  if (world_size() != 2) return;
  const int me = world_rank();
  const auto nc = comm::split_by_node(*g_world, me);
  REQUIRE(nc.ranks_per_node == 1);
  collective_options o;
  o.seed = shared_seed() + 77;
  const std::size_t count = 300001;
  hierarchical_all_reduce<float, C2s, Res, full_precision, chunked> h(nc.intra, nc.inter, count, o);
  collective_options fo = o;
  fo.seed = mix_seed(o.seed, 2, 0);  // the rail's seed (local index 0)
  all_reduce<float, C2s, Res, chunked> flat(*g_world, count, fo);
  dvec<float> a(count), b(count);
  for (int s = 0; s < 3; ++s) {
    const auto x = make_input(input_kind::normal, count, me, 500 + s);
    a.from(x);
    b.from(x);
    h.async(a.p, a.p, count, g_stream);
    flat.async(b.p, b.p, count, g_stream);
    flat.sync(g_stream);
    const auto ga = a.get(count), gb = b.get(count);
    CHECK(std::memcmp(ga.data(), gb.data(), count * sizeof(float)) == 0);
  }
}

TEST_CASE("hierarchical_reduce_scatter on NCCL: chunked equals one pass, every shape") {
  for (const auto& [N, G] : shapes()) {
    const int me = world_rank();
    const auto nc = comm::split_by_node(*g_world, me / G);
    collective_options o;
    o.seed = shared_seed() + 9;
    const std::size_t count = 100003;
    hierarchical_reduce_scatter<float, C2s, Res, full_precision, schedule::flat> one(
        nc.intra, nc.inter, count, o);
    hierarchical_reduce_scatter<float, C2s, Res, full_precision, chunked> piped(nc.intra, nc.inter,
                                                                                count, o);
    INFO(N << " x " << G);
    const std::size_t n = one.shard(count).count;
    REQUIRE(piped.shard(count).count == n);
    dvec<float> in(count), a(n + 1), b(n + 1);
    for (int s = 0; s < 2; ++s) {
      in.from(make_input(input_kind::normal, count, me, 900 + s));
      one.async(in.p, a.p, count, g_stream);
      piped.async(in.p, b.p, count, g_stream);
      piped.sync(g_stream);
      const auto ga = a.get(n), gb = b.get(n);
      CHECK(std::memcmp(ga.data(), gb.data(), n * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("a pipelined hierarchical call captured in a CUDA graph replays the eager result") {
  for (const auto& [N, G] : shapes()) {
    const int me = world_rank();
    const auto nc = comm::split_by_node(*g_world, me / G);
    const std::size_t count = 100003;
    hierarchical_all_reduce<float, C4n, feedback::none, full_precision, chunked> h(nc.intra,
                                                                                   nc.inter, count);
    INFO(N << " x " << G);
    dvec<float> in(count), eager(count), replay(count);
    in.from(make_input(input_kind::normal, count, me, 4242));
    h.async(in.p, eager.p, count, g_stream);
    h.sync(g_stream);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    LOWBIT_CUDA_TRY(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
    h.async(in.p, replay.p, count, g_stream);
    LOWBIT_CUDA_TRY(cudaStreamEndCapture(g_stream, &graph));
    LOWBIT_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
    LOWBIT_CUDA_TRY(cudaGraphLaunch(exec, g_stream));
    h.sync(g_stream);
    const auto ge = eager.get(count), gr = replay.get(count);
    CHECK(std::memcmp(ge.data(), gr.data(), count * sizeof(float)) == 0);
    LOWBIT_CUDA_TRY(cudaGraphExecDestroy(exec));
    LOWBIT_CUDA_TRY(cudaGraphDestroy(graph));
  }
}

/// What a call ended with on this rank, and its message.
struct outcome {
  int kind = 0;  // 0 returned, 1 invalid_argument, 2 timeout_error, 3 nccl_error, 4 another
  std::string what;
};
template <class F>
outcome run_call(F&& f) {
  outcome o;
  try {
    f();
  } catch (const invalid_argument& e) {
    o = {1, e.what()};
  } catch (const timeout_error& e) {
    o = {2, e.what()};
  } catch (const nccl_error& e) {
    o = {3, e.what()};
  } catch (const std::exception& e) {
    o = {4, e.what()};
  }
  return o;
}

/// Whether every rank's `o` has the same kind and message.
bool same_everywhere(const outcome& o) {
  const std::uint32_t mine[2] = {static_cast<std::uint32_t>(o.kind),
                                 lowbit::detail::fnv1a(o.what.c_str())};
  std::vector<std::uint32_t> all(2 * static_cast<std::size_t>(world_size()));
  MPI_Allgather(mine, 2, MPI_UINT32_T, all.data(), 2, MPI_UINT32_T, MPI_COMM_WORLD);
  for (int p = 0; p < world_size(); ++p)
    if (all[2 * p] != mine[0] || all[2 * p + 1] != mine[1]) return false;
  return true;
}

TEST_CASE(
    "hierarchical sync() watches the node-local communicator too: a stuck stage 1 times out "
    "and aborts both communicators") {
  // sync() polled the rail alone: at the deadline it aborted the rail, and the stream
  // stayed stuck on stage 1's kernels, the node's communicator never aborted.
  using namespace std::chrono_literals;
  for (const auto& [N, G] : shapes()) {
    if (G < 2) continue;  // one rank per node: no node-local stage
    const int me = world_rank();
    auto nc = comm::split_by_node(*g_world, me / G);
    collective_options o;
    o.timeout = 2000ms;
    const std::size_t count = 100003;
    hierarchical_all_reduce<float, C4n, feedback::none, full_precision, schedule::flat> h(
        nc.intra, nc.inter, count, o);
    cudaStream_t s = nullptr;
    LOWBIT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    dvec<float> d(count);
    d.from(make_input(input_kind::normal, count, me, 31));
    // A call on every rank first: NCCL connects its peers on a communicator's first
    // collective, on the host, which no deadline could end.
    h(d.p, d.p, count, s);
    outcome r;
    if (me == 0) {  // the others never call: rank 0's stage 1 waits for them
      const auto t0 = std::chrono::steady_clock::now();
      r = run_call([&] {
        h.async(d.p, d.p, count, s);
        h.sync(s);
      });
      INFO(N << " x " << G << ": " << r.what);
      CHECK(r.kind == 2);
      CHECK(std::chrono::steady_clock::now() - t0 < 20s);
      CHECK(nc.intra.aborted());
      CHECK(nc.inter.aborted());
    }
    // Nothing of the call is left waiting: rank 0's stream drains.
    nc.intra.abort();
    nc.inter.abort();
    LOWBIT_CUDA_TRY(cudaStreamSynchronize(s));
    LOWBIT_CUDA_TRY(cudaStreamDestroy(s));
    // Every rank reports what rank 0's call ended with (the others asserted nothing).
    int kind = r.kind;
    MPI_Bcast(&kind, 1, MPI_INT, 0, MPI_COMM_WORLD);
    INFO(N << " x " << G << ": rank 0's call ended with outcome " << kind);
    CHECK(kind == 2);
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE(
    "a hierarchical call whose rail communicator is dead throws before it enqueues anything "
    "(stage 1 included)") {
  // Stage 2's collective checked the rail only once stage 1 was enqueued: its peers'
  // stage 1 matched this rank's and their stage 3 waited for it. A call captured into a
  // graph shows what it enqueued.
  for (const auto& [N, G] : shapes()) {
    if (G < 2) continue;
    const int me = world_rank();
    auto nc = comm::split_by_node(*g_world, me / G);
    const std::size_t count = 100003;
    hierarchical_all_reduce<float, C4n, feedback::none, full_precision, schedule::flat> h(
        nc.intra, nc.inter, count);
    hierarchical_reduce_scatter<float, C4n, feedback::none, full_precision, chunked> rs(
        nc.intra, nc.inter, count);
    nc.inter.abort();  // on every rank: each throws alone, nothing waits on a peer
    cudaStream_t s = nullptr;
    LOWBIT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    dvec<float> d(count);
    for (int which = 0; which < 2; ++which) {
      INFO(N << " x " << G << (which == 0 ? ", all_reduce" : ", reduce_scatter"));
      LOWBIT_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      const outcome r = run_call([&] {
        if (which == 0)
          h.async(d.p, d.p, count, s);
        else
          rs.async(d.p, d.p, count, s);
      });
      cudaGraph_t graph = nullptr;
      LOWBIT_CUDA_TRY(cudaStreamEndCapture(s, &graph));
      std::size_t nodes = 0;
      LOWBIT_CUDA_TRY(cudaGraphGetNodes(graph, nullptr, &nodes));
      LOWBIT_CUDA_TRY(cudaGraphDestroy(graph));
      INFO(r.what);
      CHECK(r.kind == 1);
      CHECK(r.what.find("aborted") != std::string::npos);
      CHECK(nodes == 0);
    }
    LOWBIT_CUDA_TRY(cudaStreamDestroy(s));
    nc.intra.abort();
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE(
    "split_by_node: a key that only one rank finds wrong raises on every rank, nothing split") {
  // The key was checked per rank before ncclCommSplit: the rank with a negative key threw
  // and every other rank waited in ncclCommSplit for it, for ever.
  const int me = world_rank();
  const int key = me == world_size() - 1 ? -1 : 0;
  const outcome r = run_call([&] { comm::split_by_node(*g_world, key, std::chrono::seconds(30)); });
  INFO(r.what);
  CHECK(r.kind == 1);
  CHECK(r.what.find("must be >= 0") != std::string::npos);
  CHECK(same_everywhere(r));
  CHECK(g_world->valid());  // nothing was aborted: the world still works
  const auto nc = comm::split_by_node(*g_world, me);
  CHECK(nc.nodes == world_size());
}

TEST_CASE(
    "split_by_node: nodes of different sizes raise the same error on every rank, equal ones "
    "split") {
  const int me = world_rank(), P = world_size();
  const int key = me == P - 1 ? 7 : 3;  // nodes of P - 1 ranks and of 1
  // The verdict every rank reaches from the gathered keys: 3 ranks, nodes of 2 and 1.
  const std::string why = comm::detail::node_shape_error({3, 3, 7}, {0, 0, 0});
  INFO(why);
  CHECK(why.find("between 1 ranks (node key 7) and 2 (node key 3)") != std::string::npos);
  CHECK(why.find("same number of ranks") != std::string::npos);
  CHECK(comm::detail::node_shape_error({3, 7}, {0, 0}).empty());  // 1 and 1: one shape
  comm::node_comms<comm::nccl_comm> nc;
  const outcome r =
      run_call([&] { nc = comm::split_by_node(*g_world, key, std::chrono::seconds(30)); });
  INFO(r.what);
  CHECK(same_everywhere(r));
  if (P == 2) {
    // Keys 3 and 7 make nodes of one rank each (2 ranks can make no others): keys need
    // not be 0..N-1, and the nodes follow the world's rank order.
    CHECK(r.kind == 0);
    CHECK(nc.nodes == 2);
    CHECK(nc.ranks_per_node == 1);
    CHECK(nc.node == me);
    return;
  }
  CHECK(r.kind == 1);
  CHECK(r.what.find("same number of ranks") != std::string::npos);
}

TEST_CASE("split_by_node refuses a non-blocking communicator on every rank, before splitting") {
  // ncclCommSplit with no config makes the children non-blocking like their parent, which
  // lowbit's collectives do not support.
  int rank = world_rank(), size = world_size();
  ncclUniqueId id{};
  if (rank == 0) LOWBIT_NCCL_TRY(ncclGetUniqueId(&id));
  MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t raw = nullptr;
  LOWBIT_NCCL_TRY(ncclCommInitRankConfig(&raw, size, id, rank, &cfg));
  ncclResult_t st = ncclInProgress;
  while (st == ncclInProgress) LOWBIT_NCCL_TRY(ncclCommGetAsyncError(raw, &st));
  LOWBIT_NCCL_TRY(st);
  {
    comm::nccl_comm nb(raw, comm::ownership::owned);
    const outcome r = run_call([&] { comm::split_by_node(nb, 0, std::chrono::seconds(30)); });
    INFO(r.what);
    CHECK(r.kind == 1);
    CHECK(r.what.find("non-blocking") != std::string::npos);
    CHECK(same_everywhere(r));
    nb.abort();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace lowbit::test

int main(int argc, char** argv) {
  return lowbit::test::mpi_test_main(
      argc, argv,
      [] {
        lowbit::test::g_world = std::make_unique<lowbit::comm::nccl_comm>(
            lowbit::comm::nccl_comm_from_mpi(MPI_COMM_WORLD));
        LOWBIT_CUDA_TRY(cudaStreamCreateWithFlags(&lowbit::test::g_stream, cudaStreamNonBlocking));
      },
      [] {
        cudaStreamDestroy(lowbit::test::g_stream);
        lowbit::test::g_world.reset();
      });
}
