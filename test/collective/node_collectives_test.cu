// The collectives on the node backend (CUDA IPC, no NCCL), one MPI rank per process, on as
// many GPUs as there are (rank mod GPU count: several ranks share a GPU on a one-GPU
// machine): the shared cases, the device cases against the host backend bit for bit, and
// the node backend's own set-up checks.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "device_harness.cuh"
#include "lowbit/collective/mpi.hpp"
#include "lowbit/collective/node.cuh"
#include "lowbit/comm/mpi_bootstrap.hpp"
#include "lowbit/comm/node_mpi.hpp"

namespace lowbit::test {

static_assert(detail::is_backend_impl_v<backend_impl<backend::node>>);
static_assert(stream_ordered_v<backend::node>);

std::unique_ptr<comm::node_comm> g_comm;
cudaStream_t g_stream = nullptr;

const comm::node_comm& world() { return *g_comm; }
/// collective_cases.hpp's harness: device copies, the collective's own sync().
using harness = device_harness<backend::node, comm::node_comm, &world, g_stream>;

}  // namespace lowbit::test

#include "device_cases.cuh"
#include "mpi_test_main.hpp"

namespace lowbit::test {

TEST_CASE("node vs host backend: the whole all_reduce is bit-exact, feedback state included") {
  using C4s = codec<quant::absmax<4, 128>, round::stochastic>;
  using C2n = codec<quant::absmax<2, 64>, round::nearest>;
  using C8s = codec<quant::absmax<8, 256>, round::stochastic>;
  const auto two = all_reduce_algorithm::two_phase;
  const auto one = all_reduce_algorithm::one_shot;
  for (std::size_t count : {std::size_t(1), std::size_t(1000), std::size_t(100003)}) {
    check_host_device<float, C4s, feedback::none, schedule::flat>(count, 2, 1);
    check_host_device<float, C2n, feedback::residual<float, true>, schedule::pipelined<4, 1>>(
        count, 2, 2, two);
    check_host_device<__nv_bfloat16, C4s, feedback::residual<__nv_bfloat16>, schedule::flat>(
        count, 2, 3, one);
    check_host_device<float, C8s, feedback::ef21<>, schedule::pipelined<2, 1>>(count, 2, 4);
    check_host_device<__half, C2n, feedback::none, schedule::ramped<6, 1>>(count, 1, 5, two);
  }
}

TEST_CASE("node: reduce_scatter and all_gather match the host backend bit for bit") {
  using C = codec<quant::absmax<4, 128>, round::stochastic>;
  const std::size_t count = (std::size_t(1) << 18) + 4099;
  const inputs<float> in(input_kind::normal, count, 12);
  collective_options o;
  o.seed = shared_seed();
  lowbit::node::reduce_scatter<float, C, feedback::none, schedule::pipelined<4, 1>> rs(*g_comm,
                                                                                       count, o);
  lowbit::mpi::reduce_scatter<float, C, feedback::none, schedule::pipelined<4, 1>> rs_host(
      host_comm(), count, o);
  lowbit::node::all_gather<float, C, schedule::pipelined<4, 1>> ag(*g_comm, count, o);
  lowbit::mpi::all_gather<float, C, schedule::pipelined<4, 1>> ag_host(host_comm(), count, o);
  std::vector<float> a(count), b(count);
  dvec<float> din(in.mine()), dout(count);
  rs.async(din.p, dout.p, count, g_stream);
  rs.sync(g_stream);
  dout.to(a);
  rs_host(in.mine().data(), b.data(), count);
  const std::size_t shard = rs.shard(count).count;
  CHECK(std::memcmp(a.data(), b.data(), shard * sizeof(float)) == 0);
  ag.async(din.p, dout.p, count, g_stream);
  ag.sync(g_stream);
  dout.to(a);
  ag_host(in.mine().data(), b.data(), count);
  CHECK(std::memcmp(a.data(), b.data(), count * sizeof(float)) == 0);
}

TEST_CASE("node: a call captured in a CUDA graph replays the eager result") {
  check_graph<schedule::flat>(100003);
  check_graph<schedule::pipelined<4, 1>>(1 << 18);
}

TEST_CASE("node: ranks that disagree on max_count are refused at construction, on every rank") {
  using C = codec<quant::absmax<4, 128>>;
  const std::size_t mine = (world_rank() == world_size() - 1) ? 8192 : 4096;
  std::string what;
  bool threw = false;
  try {
    lowbit::node::all_reduce<float, C, feedback::none, schedule::flat> ar(*g_comm, mine);
  } catch (const lowbit::invalid_argument& e) {
    threw = true;
    what = e.what();
  }
  INFO(what);
  CHECK(threw == (world_size() > 1));
  if (world_size() > 1) CHECK(what.find("max_count") != std::string::npos);
  // The communicator stays usable.
  lowbit::node::all_reduce<float, C, feedback::none, schedule::flat> ok(*g_comm, 4096);
  const inputs<float> in(input_kind::normal, 4096, 5);
  std::vector<float> out(4096);
  harness::call(ok, in.mine(), out, 4096);
  CHECK(std::isfinite(out[0]));
}

TEST_CASE("node_comm: bad set-ups are refused with their cause") {
  CHECK_THROWS_AS(comm::node_comm(0, 0, [](const void*, void*, std::size_t) {}),
                  lowbit::invalid_argument);
  CHECK_THROWS_AS(comm::node_comm(2, 2, [](const void*, void*, std::size_t) {}),
                  lowbit::invalid_argument);
  CHECK_THROWS_AS(comm::node_comm(0, 1, comm::bootstrap_allgather{}), lowbit::invalid_argument);
  // A bootstrap that says rank 0 is on another host: refused, naming both hosts.
  const auto elsewhere = [](const void* mine, void* all, std::size_t bytes) {
    std::memcpy(all, mine, bytes);
    std::memcpy(static_cast<char*>(all) + bytes, mine, bytes);
    auto* second = reinterpret_cast<comm::node_rank_info*>(static_cast<char*>(all) + bytes);
    std::strcpy(second->host, "another-host");
    second->rank = 1;
    second->pid += 1;
  };
  try {
    comm::node_comm c(0, 2, elsewhere);
    FAIL("a group over two hosts was accepted");
  } catch (const lowbit::invalid_argument& e) {
    CHECK(std::string(e.what()).find("not on one node") != std::string::npos);
    CHECK(std::string(e.what()).find("another-host") != std::string::npos);
  }
  // One process as two ranks: refused.
  const auto same_process = [](const void* mine, void* all, std::size_t bytes) {
    std::memcpy(all, mine, bytes);
    std::memcpy(static_cast<char*>(all) + bytes, mine, bytes);
    reinterpret_cast<comm::node_rank_info*>(static_cast<char*>(all) + bytes)->rank = 1;
  };
  try {
    comm::node_comm c(0, 2, same_process);
    FAIL("two ranks in one process were accepted");
  } catch (const lowbit::invalid_argument& e) {
    CHECK(std::string(e.what()).find("one process per rank") != std::string::npos);
  }
}

}  // namespace lowbit::test

int main(int argc, char** argv) {
  return lowbit::test::mpi_test_main(
      argc, argv,
      [] {
        lowbit::test::g_comm = std::make_unique<lowbit::comm::node_comm>(
            lowbit::comm::node_comm_from_mpi(MPI_COMM_WORLD));
        LOWBIT_CUDA_TRY(cudaStreamCreateWithFlags(&lowbit::test::g_stream, cudaStreamNonBlocking));
      },
      [] {
        cudaStreamDestroy(lowbit::test::g_stream);
        lowbit::test::g_comm.reset();
      });
}
