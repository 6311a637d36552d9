// The hierarchical collectives with the node backend inside each node, on every node shape
// N x G of the job (nodes of contiguous ranks, all on one machine: on a one-GPU machine
// every process shares that GPU). Across nodes: the node backend (every shape), and NCCL
// where a rail holds one rank per GPU (one node: rails of one rank). Checked bit for bit
// against the host (MPI) backend running the same shape on the same inputs: both sum a
// node's values in fp32 in rank order, and the codecs are bit-exact host vs device. Also:
// identical on every rank, a chunked reduce_scatter equal to one pass, a coded node-local
// stage, a captured CUDA graph replaying the eager call, and a rank that never calls.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <string>
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

/// `steps` calls of the node and the host hierarchical all_reduce on shape N x G: the same
/// bits, on every rank, step after step (the feedback state included).
template <class Codec, class Feedback, class Schedule, class IntraCodec = full_precision>
void check_against_host(int N, int G, std::size_t count, int steps, std::uint64_t salt,
                        bool checked = false) {
  INFO(N << " nodes x " << G << ", count " << count << ", " << Codec::bits << " bits, "
         << Feedback::name << ", " << Schedule::name << ", intra " << IntraCodec::bits << " bits"
         << (checked ? ", checked" : ""));
  const int me = world_rank();
  shape_comms c(G);
  REQUIRE(c.mc.nodes == N);
  REQUIRE(c.mc.ranks_per_node == G);
  collective_options o;
  o.seed = shared_seed() + salt;
  o.verify = checked;
  node::hierarchical_all_reduce<float, Codec, Feedback, IntraCodec, Schedule> dev(c.intra, c.inter,
                                                                                  count, o);
  mpi::hierarchical_all_reduce<float, Codec, Feedback, IntraCodec, Schedule> host(
      c.mc.intra, c.mc.inter, count, o);
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
  for (const auto& [N, G] : shapes()) {
    INFO(N << " x " << G);
    const int me = world_rank();
    shape_comms c(G);
    collective_options o;
    o.seed = shared_seed() + salt++;
    const std::size_t count = 50001;
    node::hierarchical_all_reduce<bf16, C4n, feedback::residual<bf16>, full_precision, chunked> dev(
        c.intra, c.inter, count, o);
    mpi::hierarchical_all_reduce<bf16, C4n, feedback::residual<bf16>, full_precision, chunked> host(
        c.mc.intra, c.mc.inter, count, o);
    dvec<bf16> d(count);
    for (int s = 0; s < 2; ++s) {
      const auto x = convert<bf16>(make_input(input_kind::normal, count, me, 600 + s));
      d.from(x);
      dev.async(d.p, d.p, count, g_stream);
      dev.sync(g_stream);
      std::vector<bf16> want(count);
      host(x.data(), want.data(), count);
      const auto got = d.get(count);
      CHECK(std::memcmp(got.data(), want.data(), count * sizeof(bf16)) == 0);
      CHECK(same_on_all_ranks(got.data(), count * sizeof(bf16)));
    }
  }
}

TEST_CASE("hierarchical_reduce_scatter on the node backend: the host's bits, chunked or not") {
  for (const auto& [N, G] : shapes()) {
    const int me = world_rank();
    shape_comms c(G);
    collective_options o;
    o.seed = shared_seed() + 9;
    const std::size_t count = 100003;
    node::hierarchical_reduce_scatter<float, C2s, Res, full_precision, schedule::flat> one(
        c.intra, c.inter, count, o);
    node::hierarchical_reduce_scatter<float, C2s, Res, full_precision, chunked> piped(
        c.intra, c.inter, count, o);
    mpi::hierarchical_reduce_scatter<float, C2s, Res, full_precision, schedule::flat> host(
        c.mc.intra, c.mc.inter, count, o);
    INFO(N << " x " << G);
    const std::size_t n = one.shard(count).count;
    REQUIRE(piped.shard(count).count == n);
    REQUIRE(host.shard(count).count == n);
    dvec<float> in(count), a(n + 1), b(n + 1);
    for (int s = 0; s < 2; ++s) {
      const auto x = make_input(input_kind::normal, count, me, 900 + s);
      in.from(x);
      one.async(in.p, a.p, count, g_stream);
      piped.async(in.p, b.p, count, g_stream);
      piped.sync(g_stream);
      one.sync(g_stream);
      std::vector<float> want(n + 1);
      host(x.data(), want.data(), count);
      const auto ga = a.get(n), gb = b.get(n);
      CHECK(std::memcmp(ga.data(), gb.data(), n * sizeof(float)) == 0);
      CHECK(std::memcmp(ga.data(), want.data(), n * sizeof(float)) == 0);
    }
  }
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
