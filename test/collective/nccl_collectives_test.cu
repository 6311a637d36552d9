// The collectives on the NCCL backend (2 GPUs, one MPI rank each): the shared cases,
// host-vs-device bit-exactness of the whole all_reduce, and CUDA-graph capture.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "device_harness.cuh"
#include "lowbit/collective/mpi.hpp"
#include "lowbit/collective/nccl.cuh"
#include "lowbit/comm/mpi_bootstrap.hpp"

namespace lowbit::test {

// The NCCL backend models the backend concept (collective/backend.hpp).
static_assert(detail::is_backend_impl_v<detail::backend_impl<backend::nccl>>);

std::unique_ptr<comm::nccl_comm> g_comm;
cudaStream_t g_stream = nullptr;

const comm::nccl_comm& world() { return *g_comm; }
/// collective_cases.hpp's harness: device copies, the collective's own sync().
using harness = device_harness<backend::nccl, comm::nccl_comm, &world, g_stream>;

}  // namespace lowbit::test

#include "device_cases.cuh"
#include "mpi_test_main.hpp"

namespace lowbit::test {

TEST_CASE("nccl vs host backend: the whole all_reduce is bit-exact, feedback state included") {
  using C4s = codec<quant::absmax<4, 128>, round::stochastic>;
  using C2n = codec<quant::absmax<2, 64>, round::nearest>;
  using C8s = codec<quant::absmax<8, 256>, round::stochastic>;
  for (std::size_t count :
       {std::size_t(1), std::size_t(1000), std::size_t(100003), std::size_t(1) << 20}) {
    check_host_device<float, C4s, feedback::none, schedule::flat>(count, 2, 1);
    check_host_device<float, C2n, feedback::residual<float, true>, schedule::pipelined<4, 1>>(count,
                                                                                              3, 2);
    check_host_device<__nv_bfloat16, C4s, feedback::residual<__nv_bfloat16>, schedule::flat>(count,
                                                                                             3, 3);
    check_host_device<float, C8s, feedback::ef21<>, schedule::pipelined<2, 1>>(count, 3, 4);
    check_host_device<__half, C2n, feedback::none, schedule::pipelined<3, 1>>(count, 1, 5);
    // The other algorithm than two ranks pick by default.
    const auto two = all_reduce_algorithm::two_phase;
    check_host_device<float, C4s, feedback::none, schedule::flat>(count, 2, 6, two);
    check_host_device<float, C2n, feedback::residual<float, true>, schedule::pipelined<4, 1>>(
        count, 3, 7, two);
    check_host_device<__nv_bfloat16, C4s, feedback::residual<__nv_bfloat16>, schedule::flat>(
        count, 3, 8, two);
    check_host_device<float, C8s, feedback::ef21<>, schedule::pipelined<2, 1>>(count, 3, 9, two);
    // Every transport moves the same bytes (automatic ran above).
    for (const auto tr :
         {frame_transport::nccl, frame_transport::peer_stores, frame_transport::copy_engines}) {
      const auto one = all_reduce_algorithm::one_shot;
      check_host_device<float, C4s, feedback::none, schedule::pipelined<4, 1>>(count, 2, 10, one,
                                                                               tr);
      check_host_device<__nv_bfloat16, C4s, feedback::residual<__nv_bfloat16>, schedule::flat>(
          count, 2, 11, two, tr);
    }
    // automatic with the copy engines' threshold lowered to 64 KiB: at 4 bits the pieces'
    // all-gathers straddle it (copy engines for the middle ones, NCCL kernels for the
    // ends), as they do on large tensors; 8-bit codes keep peer stores below 32 MiB.
    lowbit::transport::policy low = lowbit::transport::default_policy();
    low.copy_engine_min_bytes = 65536;
    const auto autom = all_reduce_algorithm::automatic;
    const auto autot = frame_transport::automatic;
    check_host_device<float, C4s, feedback::none, schedule::ramped<6, 1>>(count, 2, 12, autom,
                                                                          autot, low);
    check_host_device<float, C8s, feedback::none, schedule::ramped<6, 1>>(count, 2, 13, autom,
                                                                          autot, low);
  }
}

TEST_CASE("reduce_scatter and all_gather match the host backend on every transport") {
  using C = codec<quant::absmax<4, 128>, round::stochastic>;
  const std::size_t count = (std::size_t(1) << 20) + 4099;
  const inputs<float> in(input_kind::normal, count, 12);
  for (const auto tr : all_frame_transports) {
    INFO(to_string(tr));
    collective_options o;
    o.seed = shared_seed();
    o.transport = tr;
    lowbit::reduce_scatter<float, C, feedback::none, schedule::pipelined<4, 1>, backend::nccl> rs(
        *g_comm, count, o);
    lowbit::reduce_scatter<float, C, feedback::none, schedule::pipelined<4, 1>, backend::mpi>
        rs_host(host_comm(), count, o);
    lowbit::all_gather<float, C, schedule::pipelined<4, 1>, backend::nccl> ag(*g_comm, count, o);
    lowbit::all_gather<float, C, schedule::pipelined<4, 1>, backend::mpi> ag_host(host_comm(),
                                                                                  count, o);
    std::vector<float> a(count), b(count);
    dvec<float> din(in.mine()), dout(count);
    rs.async(din.p, dout.p, count, g_stream);
    g_comm->sync(g_stream);
    dout.to(a);
    rs_host(in.mine().data(), b.data(), count);
    const std::size_t shard = rs.shard(count).count;
    CHECK(std::memcmp(a.data(), b.data(), shard * sizeof(float)) == 0);
    ag.async(din.p, dout.p, count, g_stream);
    g_comm->sync(g_stream);
    dout.to(a);
    ag_host(in.mine().data(), b.data(), count);
    CHECK(std::memcmp(a.data(), b.data(), count * sizeof(float)) == 0);
  }
}

TEST_CASE("a call captured in a CUDA graph replays the eager result") {
  check_graph<schedule::flat>(100003);
  check_graph<schedule::pipelined<4, 1>>(1 << 20);
  check_graph<schedule::pipelined<4, 1>>(1 << 20, frame_transport::nccl);
  check_graph<schedule::pipelined<4, 1>>(1 << 20, frame_transport::peer_stores);
  check_graph<schedule::pipelined<4, 1>>(1 << 20, frame_transport::copy_engines);
}

TEST_CASE("below the crossover each collective is the plain NCCL collective, bit for bit") {
  using C4 = codec<quant::absmax<4, 128>>;
  using T = __nv_bfloat16;
  // Uneven block-aligned shards (grouped per-owner calls), then equal ones (NCCL's own
  // reduce_scatter and all_gather).
  const std::size_t count = GENERATE(std::size_t{5000 + 37},
                                     std::size_t{128} * 3 * static_cast<std::size_t>(world_size()));
  const inputs<T> in(input_kind::normal, count, 71);
  collective_options o;
  o.crossover_bytes = count * sizeof(T) + 1;  // this call is below it
  dvec<T> din(in.mine()), dout(count), dref(count);
  std::vector<T> a(count), b(count);

  lowbit::all_reduce<T, C4, feedback::none, schedule::flat, backend::nccl> ar(*g_comm, count, o);
  ar.async(din.p, dout.p, count, g_stream);
  LOWBIT_NCCL_TRY(
      ncclAllReduce(din.p, dref.p, count, ncclBfloat16, ncclSum, g_comm->get(), g_stream));
  g_comm->sync(g_stream);
  dout.to(a);
  dref.to(b);
  CHECK(std::memcmp(a.data(), b.data(), count * sizeof(T)) == 0);

  // reduce_scatter: my block-aligned shard of that same sum.
  lowbit::reduce_scatter<T, C4, feedback::none, schedule::flat, backend::nccl> rs(*g_comm, count,
                                                                                  o);
  const schedule::range sh = rs.shard(count);
  rs.async(din.p, dout.p, count, g_stream);
  g_comm->sync(g_stream);
  dout.to(a);
  CHECK(std::memcmp(a.data(), b.data() + sh.begin, sh.count * sizeof(T)) == 0);

  // all_gather: every rank's shard in place, exactly.
  lowbit::all_gather<T, C4, schedule::flat, backend::nccl> ag(*g_comm, count, o);
  ag.async(din.p + ag.shard(count).begin, dout.p, count, g_stream);
  g_comm->sync(g_stream);
  dout.to(a);
  for (int p = 0; p < g_comm->size(); ++p) {
    const schedule::range r = schedule::shard(count, C4::block_size, g_comm->size(), p);
    const std::vector<T>& theirs = in.xs[static_cast<std::size_t>(p)];
    CHECK(std::memcmp(a.data() + r.begin, theirs.data() + r.begin, r.count * sizeof(T)) == 0);
  }
}

TEST_CASE("collectives on one communicator share its copy-engine split and peer probe") {
  using C4 = codec<quant::absmax<4, 128>, round::stochastic>;
  using C8 = codec<quant::absmax<8, 256>, round::stochastic>;
  const std::size_t count = std::size_t{1} << 16;
  const inputs<float> in(input_kind::normal, count, 91);
  collective_options o;
  o.seed = shared_seed();
  comm::nccl_comm c = comm::nccl_comm_from_mpi(MPI_COMM_WORLD);
  {
    // Automatic at 4 bits (a probe, no device communicator kept) and at 8 bits (peer
    // stores), then copy engines asked for: one split, made by the first that needs it.
    lowbit::all_reduce<float, C4, feedback::none, schedule::pipelined<4, 1>, backend::nccl> a4(
        c, count, o);
    lowbit::all_reduce<float, C8, feedback::none, schedule::flat, backend::nccl> a8(c, count, o);
    const ncclComm_t first = lowbit::transport::copy_engines_comm(c);
    collective_options ce = o;
    ce.transport = frame_transport::copy_engines;
    lowbit::all_gather<float, C4, schedule::pipelined<4, 1>, backend::nccl> ag(c, count, ce);
    using rs_type =
        lowbit::reduce_scatter<float, C4, feedback::none, schedule::flat, backend::nccl>;
    rs_type rs(c, count, o);
    CHECK(lowbit::transport::copy_engines_comm(c) == first);
    CHECK((first != nullptr) == (LOWBIT_HAS_NCCL_ZERO_CTA != 0));
    CHECK(a4.transport() == rs.transport());
    if (first != nullptr) CHECK(ag.transport() == frame_transport::copy_engines);
    // The probe ran once, for a4; a8 and rs took its answer.
    bool probed_again = false;
    const bool mapped = c.peers_mapped([&](ncclComm_t) {
      probed_again = true;
      return false;
    });
    if (LOWBIT_HAS_NCCL_WINDOWS) CHECK_FALSE(probed_again);
    if (first != nullptr) CHECK(mapped == (a4.transport() == frame_transport::copy_engines));
    // The shared split carries ag's all-gathers, every one on the copy engines: its
    // output matches the host backend's bit for bit.
    using host_type = lowbit::all_gather<float, C4, schedule::pipelined<4, 1>, backend::mpi>;
    host_type host(host_comm(), count, o);
    dvec<float> din(in.mine()), dout(count);
    std::vector<float> x(count), y(count);
    ag.async(din.p, dout.p, count, g_stream);
    c.sync(g_stream);
    dout.to(x);
    host(in.mine().data(), y.data(), count);
    CHECK(std::memcmp(x.data(), y.data(), count * sizeof(float)) == 0);
    // Leaving: the collectives deregister their windows from the split, then `c` destroys
    // the split before its own handle. Neither may hang.
  }
}

TEST_CASE("calibrate_crossover agrees on every rank and restores the collective's state") {
  using C4 = codec<quant::absmax<4, 128>, round::stochastic>;
  const std::size_t max_count = std::size_t{1} << 22;
  lowbit::all_reduce<float, C4, feedback::residual<float>, schedule::flat, backend::nccl> ar(
      *g_comm, max_count);
  ar.set_step(7);
  const std::size_t x = calibrate_crossover(ar, *g_comm, g_stream, std::size_t{16} << 20, 3);
  CHECK(ar.crossover_bytes() == x);
  CHECK(ar.step() == 7u);
  CHECK(x <= max_count * sizeof(float) + 1);
  unsigned long long mine = x, lo = 0, hi = 0;
  MPI_Allreduce(&mine, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lo == hi);
  if (g_comm->rank() == 0) std::printf("calibrated crossover: %zu bytes\n", x);
}

}  // namespace lowbit::test

int main(int argc, char** argv) {
  return lowbit::test::mpi_test_main(
      argc, argv,
      [] {
        lowbit::test::g_comm = std::make_unique<lowbit::comm::nccl_comm>(
            lowbit::comm::nccl_comm_from_mpi(MPI_COMM_WORLD));
        LOWBIT_CUDA_TRY(cudaStreamCreateWithFlags(&lowbit::test::g_stream, cudaStreamNonBlocking));
      },
      [] {
        cudaStreamDestroy(lowbit::test::g_stream);
        lowbit::test::g_comm.reset();
      });
}
