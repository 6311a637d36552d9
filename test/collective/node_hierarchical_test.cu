// The hierarchical collectives with the node backend inside each node, on every node shape
// N x G of the job (nodes of contiguous ranks, all on one machine: on a one-GPU machine
// every process shares that GPU). Across nodes: the node backend and MPI (every shape; MPI
// stages the rail shard through pinned host memory), and NCCL where a rail holds one rank
// per GPU (one node: rails of one rank). Checked bit for bit against the host (MPI)
// backend running the same shape on the same inputs: both sum a node's values in fp32 in
// rank order, and the codecs are bit-exact host vs device. Also: identical on every rank,
// a chunked reduce_scatter equal to one pass, a coded node-local stage, a captured CUDA
// graph replaying the eager call, a rank that never calls, and (MPI across) ranks whose
// counts differ.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "collective_test_util.hpp"
#include "device_harness.cuh"
#include "lowbit/collective/mpi.hpp"
#include "lowbit/collective/nccl.cuh"
#include "lowbit/collective/node.cuh"
#include "lowbit/comm/mpi_bootstrap.hpp"
#include "lowbit/comm/node_mpi.hpp"
#include "mpi_test_main.hpp"

namespace lowbit::test {
namespace {

using C4n = codec<quant::absmax<4, 128>, round::nearest>;
using C2s = codec<quant::absmax<2, 64>, round::stochastic>;
using C8n = codec<quant::absmax<8, 128>, round::nearest>;
using Res = feedback::residual<>;
/// Chunks small enough that a 10^5-value call is cut: the pipelined path where N, G > 1.
using chunked = schedule::pipelined<4, 4096>;

cudaStream_t g_stream = nullptr;

const comm::mpi_comm& mpi_world() {
  static const comm::mpi_comm c(MPI_COMM_WORLD);
  return c;
}

/// Every (nodes, ranks per node) whose product is the world size.
std::vector<std::pair<int, int>> shapes() {
  std::vector<std::pair<int, int>> s;
  for (int g = 1; g <= world_size(); ++g)
    if (world_size() % g == 0) s.push_back({world_size() / g, g});
  return s;
}

/// A shape's communicators: MPI's (for the host backend) and the node backend's over them.
struct shape_comms {
  comm::node_comms<comm::mpi_comm> mc;
  comm::node_comm intra, inter;
  explicit shape_comms(int G)
      : mc(comm::split_by_node(mpi_world(), world_rank() / G)),
        intra(comm::node_comm_from_mpi(mc.intra.get())),
        inter(comm::node_comm_from_mpi(mc.inter.get())) {}
};

/// The cross-node communicator of a pairing with `Across` between nodes: the node
/// backend's, or MPI's rail.
template <class Across>
const auto& across(const shape_comms& c) {
  if constexpr (std::is_same_v<Across, backend::mpi>)
    return c.mc.inter;
  else
    return c.inter;
}

/// One call of a node hierarchical collective, complete when this returns: async() then
/// sync() where both backends are stream-ordered, operator() with MPI across (no async()).
template <class Across, class H, class T>
void call(H& h, const T* in, T* out, std::size_t count) {
  if constexpr (stream_ordered_v<Across>) {
    h.async(in, out, count, g_stream);
    h.sync(g_stream);
  } else {
    h(in, out, count, g_stream);
  }
}

/// `steps` calls of the node and the host hierarchical all_reduce on shape N x G: the same
/// bits, on every rank, step after step (the feedback state included).
template <class Codec, class Feedback, class Schedule, class IntraCodec = full_precision,
          class T = float, class Across = backend::node>
void check_against_host(int N, int G, std::size_t count, int steps, std::uint64_t salt,
                        bool checked = false) {
  INFO(N << " nodes x " << G << ", count " << count << ", " << sizeof(T) << "-byte values, "
         << Codec::bits << " bits, " << Feedback::name << ", " << Schedule::name << ", intra "
         << IntraCodec::bits << " bits, " << Across::name << " across"
         << (checked ? ", checked" : ""));
  const int me = world_rank();
  shape_comms c(G);
  REQUIRE(c.mc.nodes == N);
  REQUIRE(c.mc.ranks_per_node == G);
  collective_options o;
  o.seed = shared_seed() + salt;
  o.verify = checked;
  node::hierarchical_all_reduce<T, Codec, Feedback, IntraCodec, Schedule, Across> dev(
      c.intra, across<Across>(c), count, o);
  mpi::hierarchical_all_reduce<T, Codec, Feedback, IntraCodec, Schedule> host(c.mc.intra,
                                                                              c.mc.inter, count, o);
  dvec<T> d(count);
  for (int s = 0; s < steps; ++s) {
    const auto x = convert<T>(make_input(input_kind::normal, count, me, salt * 17 + s));
    d.from(x);
    call<Across>(dev, d.p, d.p, count);  // in place
    std::vector<T> want(count);
    host(x.data(), want.data(), count);
    const auto got = d.get(count);
    CHECK(std::memcmp(got.data(), want.data(), count * sizeof(T)) == 0);
    CHECK(same_on_all_ranks(got.data(), count * sizeof(T)));
    CHECK(dev.step() == host.step());
  }
}

TEST_CASE("hierarchical_all_reduce on the node backend: every node shape, equal to the host") {
  std::uint64_t salt = 1;
  for (const auto& [N, G] : shapes())
    for (const std::size_t count : {std::size_t(1), std::size_t(1000), std::size_t(100003)}) {
      check_against_host<C4n, feedback::none, schedule::flat>(N, G, count, 1, salt++);
      check_against_host<C2s, Res, chunked>(N, G, count, 3, salt++);
    }
}

TEST_CASE("hierarchical_all_reduce on the node backend: checked mode, and a coded node stage") {
  std::uint64_t salt = 100;
  for (const auto& [N, G] : shapes()) {
    check_against_host<C4n, feedback::none, chunked>(N, G, 100003, 2, salt++, true);
    check_against_host<C4n, feedback::none, schedule::flat, C8n>(N, G, 20000, 2, salt++);
  }
}

TEST_CASE("hierarchical_all_reduce on the node backend in bfloat16: the host's bits") {
  // The node stage sums in fp32 and rounds once to bf16, as the host stage does.
  using bf16 = __nv_bfloat16;
  std::uint64_t salt = 300;
  for (const auto& [N, G] : shapes())
    check_against_host<C4n, feedback::residual<bf16>, chunked, full_precision, bf16>(N, G, 50001, 2,
                                                                                     salt++);
}

/// On every node shape, a flat and a chunked hierarchical reduce_scatter with `Across`
/// between nodes against the host's flat one: the same bits, call after call.
template <class T, class Across>
void check_reduce_scatter_against_host(std::uint64_t salt) {
  for (const auto& [N, G] : shapes()) {
    const int me = world_rank();
    shape_comms c(G);
    collective_options o;
    o.seed = shared_seed() + salt;
    const std::size_t count = 100003;
    node::hierarchical_reduce_scatter<T, C2s, Res, full_precision, schedule::flat, Across> one(
        c.intra, across<Across>(c), count, o);
    node::hierarchical_reduce_scatter<T, C2s, Res, full_precision, chunked, Across> piped(
        c.intra, across<Across>(c), count, o);
    mpi::hierarchical_reduce_scatter<T, C2s, Res, full_precision, schedule::flat> host(
        c.mc.intra, c.mc.inter, count, o);
    INFO(N << " x " << G << ", " << sizeof(T) << "-byte values, " << Across::name << " across");
    const std::size_t n = one.shard(count).count;
    REQUIRE(piped.shard(count).count == n);
    REQUIRE(host.shard(count).count == n);
    dvec<T> in(count), a(n + 1), b(n + 1);
    for (int s = 0; s < 2; ++s) {
      const auto x = convert<T>(make_input(input_kind::normal, count, me, 900 + s));
      in.from(x);
      if constexpr (stream_ordered_v<Across>) {  // both in flight at once
        one.async(in.p, a.p, count, g_stream);
        piped.async(in.p, b.p, count, g_stream);
        piped.sync(g_stream);
        one.sync(g_stream);
      } else {
        one(in.p, a.p, count, g_stream);
        piped(in.p, b.p, count, g_stream);
      }
      std::vector<T> want(n + 1);
      host(x.data(), want.data(), count);
      const auto ga = a.get(n), gb = b.get(n);
      CHECK(std::memcmp(ga.data(), gb.data(), n * sizeof(T)) == 0);
      CHECK(std::memcmp(ga.data(), want.data(), n * sizeof(T)) == 0);
    }
  }
}

TEST_CASE("hierarchical_reduce_scatter on the node backend: the host's bits, chunked or not") {
  check_reduce_scatter_against_host<float, backend::node>(9);
}

TEST_CASE("hierarchical_all_reduce: the node backend inside, MPI across, every node shape") {
  // Stage 2 is the host backend's own collective on a pinned copy of the rail shard: the
  // bits of mpi::hierarchical_all_reduce, flat and pipelined, fp32 and bf16.
  using bf16 = __nv_bfloat16;
  using mpi_across = backend::mpi;
  std::uint64_t salt = 500;
  for (const auto& [N, G] : shapes()) {
    for (const std::size_t count : {std::size_t(1), std::size_t(1000), std::size_t(100003)}) {
      check_against_host<C4n, feedback::none, schedule::flat, full_precision, float, mpi_across>(
          N, G, count, 1, salt++);
      check_against_host<C2s, Res, chunked, full_precision, float, mpi_across>(N, G, count, 2,
                                                                               salt++);
    }
    check_against_host<C4n, feedback::none, schedule::flat, full_precision, bf16, mpi_across>(
        N, G, 50001, 1, salt++);
    check_against_host<C4n, feedback::residual<bf16>, chunked, full_precision, bf16, mpi_across>(
        N, G, 50001, 2, salt++);
    check_against_host<C4n, feedback::none, chunked, full_precision, float, mpi_across>(
        N, G, 100003, 1, salt++, true);  // checked mode
    check_against_host<C4n, feedback::none, schedule::flat, C8n, float, mpi_across>(N, G, 20000, 2,
                                                                                    salt++);
  }
}

TEST_CASE("hierarchical_reduce_scatter: the node backend inside, MPI across: the host's bits") {
  check_reduce_scatter_against_host<float, backend::mpi>(10);
  check_reduce_scatter_against_host<__nv_bfloat16, backend::mpi>(11);
}

TEST_CASE("hierarchical_all_reduce: the node backend inside, NCCL across (rails of one rank)") {
  // One node of every rank: each rail is one process, so NCCL's communicator of one rank
  // works where several processes share a GPU; the node-local stages are the node backend's.
  const int me = world_rank(), P = world_size();
  shape_comms c(P);
  const comm::nccl_comm rail = comm::nccl_comm_from_mpi(c.mc.inter.get());
  REQUIRE(rail.size() == 1);
  collective_options o;
  o.seed = shared_seed() + 31;
  const std::size_t count = 100003;
  lowbit::hierarchical_all_reduce<float, C2s, Res, full_precision, chunked, backend::nccl,
                                  backend::node>
      mixed(c.intra, rail, count, o);
  mpi::hierarchical_all_reduce<float, C2s, Res, full_precision, chunked> host(c.mc.intra,
                                                                              c.mc.inter, count, o);
  dvec<float> d(count);
  for (int s = 0; s < 2; ++s) {
    const auto x = make_input(input_kind::normal, count, me, 77 + s);
    d.from(x);
    mixed.async(d.p, d.p, count, g_stream);
    mixed.sync(g_stream);
    std::vector<float> want(count);
    host(x.data(), want.data(), count);
    const auto got = d.get(count);
    CHECK(std::memcmp(got.data(), want.data(), count * sizeof(float)) == 0);
    CHECK(same_on_all_ranks(got.data(), count * sizeof(float)));
  }
}

TEST_CASE("a pipelined node hierarchical call captured in a CUDA graph replays the eager result") {
  for (const auto& [N, G] : shapes()) {
    const int me = world_rank();
    shape_comms c(G);
    const std::size_t count = 100003;
    node::hierarchical_all_reduce<float, C4n, feedback::none, full_precision, chunked> h(
        c.intra, c.inter, count);
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
    for (int r = 0; r < 2; ++r) {  // the flags' epochs advance on every replay
      LOWBIT_CUDA_TRY(cudaMemsetAsync(replay.p, 0, count * sizeof(float), g_stream));
      LOWBIT_CUDA_TRY(cudaGraphLaunch(exec, g_stream));
      h.sync(g_stream);
      const auto ge = eager.get(count), gr = replay.get(count);
      CHECK(std::memcmp(ge.data(), gr.data(), count * sizeof(float)) == 0);
    }
    LOWBIT_CUDA_TRY(cudaGraphExecDestroy(exec));
    LOWBIT_CUDA_TRY(cudaGraphDestroy(graph));
  }
}

TEST_CASE(
    "a node hierarchical call that a rank never joins: timeout_error within the deadline, "
    "both communicators aborted, nothing written") {
  using namespace std::chrono_literals;
  for (const auto& [N, G] : shapes()) {
    if (N * G < 2) continue;
    const int me = world_rank();
    shape_comms c(G);
    collective_options o;
    o.timeout = 2000ms;
    const std::size_t count = 100003;
    node::hierarchical_all_reduce<float, C4n, feedback::none, full_precision, schedule::flat> h(
        c.intra, c.inter, count, o);
    dvec<float> d(count), out(count);
    d.from(make_input(input_kind::normal, count, me, 31));
    h.async(d.p, out.p, count, g_stream);  // one call on every rank first
    h.sync(g_stream);
    int kind = 0;
    if (me == 0) {  // the others never call: rank 0 waits for them
      LOWBIT_CUDA_TRY(cudaMemset(out.p, 0, count * sizeof(float)));
      const auto t0 = std::chrono::steady_clock::now();
      try {
        h.async(d.p, out.p, count, g_stream);
        h.sync(g_stream);
      } catch (const timeout_error& e) {
        kind = 2;
        INFO(e.what());
        CHECK(std::string(e.what()).find("timed out") != std::string::npos);
      } catch (const std::exception& e) {
        kind = 4;
        INFO(e.what());
        CHECK(false);
      }
      CHECK(std::chrono::steady_clock::now() - t0 < 10s);
      CHECK(c.intra.aborted());
      CHECK(c.inter.aborted());
      const auto got = out.get(count);
      std::size_t nonzero = 0;
      for (float v : got) nonzero += v != 0.0f;
      CHECK(nonzero == 0);
    }
    MPI_Bcast(&kind, 1, MPI_INT, 0, MPI_COMM_WORLD);
    INFO(N << " x " << G << ": rank 0's call ended with outcome " << kind);
    CHECK(kind == 2);
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

/// Runs f: 1 when it throws E (its message in `what`), 2 on another exception, 0 when it
/// returns.
template <class E, class F>
int outcome(F&& f, std::string& what) {
  try {
    f();
  } catch (const E& e) {
    what = e.what();
    return 1;
  } catch (const std::exception& e) {
    what = e.what();
    return 2;
  }
  return 0;
}

/// A node-inside, MPI-across hierarchical all_reduce of up to `count` values on shape
/// N x G, with its input and a zeroed output in device memory.
struct mpi_across_call {
  shape_comms c;
  node::hierarchical_all_reduce<float, C4n, feedback::none, full_precision, chunked, backend::mpi>
      h;
  dvec<float> in, out;
  mpi_across_call(int G, std::size_t count, std::chrono::milliseconds timeout)
      : c(G), h(c.intra, c.mc.inter, count, options(timeout)), in(count), out(count) {
    in.from(make_input(input_kind::normal, count, world_rank(), 32));
    zero_output();
  }
  static collective_options options(std::chrono::milliseconds timeout) {
    collective_options o;
    o.timeout = timeout;
    return o;
  }
  void zero_output() {
    LOWBIT_CUDA_TRY(cudaMemset(out.p, 0, out.n * sizeof(float)));
    LOWBIT_CUDA_TRY(cudaDeviceSynchronize());  // the calls' stream does not wait for it
  }
  /// After a call whose outcome() is `kind`: it raised the error expected (1), nothing
  /// was written, and both communicators are poisoned, or both still usable.
  void check_failed(int kind, bool poisoned) const {
    CHECK(kind == 1);
    CHECK(c.intra.aborted() == poisoned);
    CHECK(c.mc.inter.unusable() == poisoned);
    std::size_t written = 0;
    for (float v : out.get(out.n)) written += v != 0.0f;
    CHECK(written == 0);
  }
};

/// f(N, G, call) on every node shape, with a fresh mpi_across_call.
template <class F>
void on_every_shape(std::size_t count, std::chrono::milliseconds timeout, F&& f) {
  for (const auto& [N, G] : shapes()) {
    mpi_across_call m(G, count, timeout);
    f(N, G, m);
  }
}

/// Every rank's `kind`, rank by rank.
std::vector<int> on_every_rank(int kind) {
  std::vector<int> all(static_cast<std::size_t>(world_size()));
  MPI_Allgather(&kind, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
  return all;
}

TEST_CASE(
    "node inside, MPI across: a rank that never joins a call: timeout_error on every other "
    "rank within the deadline, both communicators poisoned, nothing written") {
  using namespace std::chrono_literals;
  const std::size_t count = 100003;
  on_every_shape(count, 2000ms, [&](int N, int G, mpi_across_call& m) {
    m.h(m.in.p, m.out.p, count, g_stream);  // one call on every rank first
    m.zero_output();
    const bool absent = world_rank() == world_size() - 1;
    int kind = 0;   // 1 timeout_error, 2 another error, 0 returned or never called
    if (!absent) {  // the last rank never calls: every other rank waits for it
      std::string what;
      const auto t0 = std::chrono::steady_clock::now();
      kind = outcome<timeout_error>([&] { m.h(m.in.p, m.out.p, count, g_stream); }, what);
      INFO(N << " x " << G << ": " << what);
      CHECK(std::chrono::steady_clock::now() - t0 < 15s);  // two 2 s deadlines at most
      m.check_failed(kind, true);
    }
    const std::vector<int> all = on_every_rank(kind);
    INFO(N << " x " << G);
    for (int r = 0; r + 1 < world_size(); ++r) CHECK(all[static_cast<std::size_t>(r)] == 1);
    MPI_Barrier(MPI_COMM_WORLD);
  });
}

TEST_CASE(
    "node inside, MPI across: ranks whose counts differ: agreement_error on every rank, "
    "nothing written, both communicators still usable") {
  using namespace std::chrono_literals;
  const std::size_t count = 1000;
  on_every_shape(count, 20000ms, [&](int N, int G, mpi_across_call& m) {
    const std::size_t mine = world_rank() == 0 ? count - 1 : count;
    std::string what;
    const int kind = outcome<agreement_error>([&] { m.h(m.in.p, m.out.p, mine, g_stream); }, what);
    INFO(N << " x " << G << ": " << what);
    m.check_failed(kind, false);
    for (const int k : on_every_rank(kind)) CHECK(k == 1);
  });
}

}  // namespace
}  // namespace lowbit::test

int main(int argc, char** argv) {
  return lowbit::test::mpi_test_main(
      argc, argv,
      [] {
        LOWBIT_CUDA_TRY(cudaStreamCreateWithFlags(&lowbit::test::g_stream, cudaStreamNonBlocking));
      },
      [] { cudaStreamDestroy(lowbit::test::g_stream); });
}
