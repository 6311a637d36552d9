// Cases both device backends run (NCCL's and the node backend's), against the MPI host
// backend in the same processes: a whole all_reduce bit for bit, step after step (feedback
// state included), and a call captured in a CUDA graph. The including test defines
// `harness` (device_harness.cuh) and g_stream first.
#pragma once

#include <catch2/catch.hpp>

#include <cstring>
#include <type_traits>
#include <vector>

#include "collective_cases.hpp"
#include "lowbit/collective/mpi.hpp"

namespace lowbit::test {

const comm::mpi_comm& host_comm() {
  static const comm::mpi_comm c(MPI_COMM_WORLD);
  return c;
}

/// The same all_reduce, step after step, on the device and on the host backend.
template <class T, class C, class F, class S>
void check_host_device(
    std::size_t count, int steps, std::uint64_t salt,
    all_reduce_algorithm algo = all_reduce_algorithm::automatic,
    frame_transport transport = frame_transport::automatic,
    const lowbit::transport::policy& tuning = lowbit::transport::default_policy()) {
  INFO("count " << count << ", " << C::bits << " bits, " << F::name << ", " << S::name << ", "
                << to_string(algo) << ", " << to_string(transport) << ", "
                << lowbit::transport::to_string(tuning));
  const inputs<T> in(input_kind::normal, count, salt);
  collective_options o;
  o.seed = shared_seed() ^ salt;
  o.op = reduce_op::avg;
  o.algorithm = algo;
  o.transport = transport;
  o.transport_policy = tuning;
  lowbit::all_reduce<T, C, F, S, typename harness::backend> dev(harness::comm(), count, o);
  // automatic reports copy_engines where the peers are mapped and NCCL has CTA policies;
  // peer_stores and copy_engines fall back to nccl_symmetric where they cannot be used.
  const frame_transport got = dev.transport();
  if constexpr (std::is_same_v<typename harness::backend, backend::node>)
    CHECK(got == frame_transport::peer_stores);  // the node backend's one transport
  else {
    if (transport == frame_transport::nccl) CHECK(got == frame_transport::nccl);
    if (transport == frame_transport::nccl_symmetric) CHECK(got == frame_transport::nccl_symmetric);
    if (transport == frame_transport::peer_stores)
      CHECK((got == frame_transport::peer_stores || got == frame_transport::nccl_symmetric));
    if (transport == frame_transport::copy_engines || transport == frame_transport::automatic)
      CHECK((got == frame_transport::copy_engines || got == frame_transport::nccl_symmetric));
  }
  lowbit::all_reduce<T, C, F, S, backend::mpi> host(host_comm(), count, o);
  dvec<T> din(in.mine()), dout(count);
  std::vector<T> a(count), b(count);
  int mismatched_steps = 0;
  for (int t = 0; t < steps; ++t) {
    dev.async(din.p, dout.p, count, g_stream);
    dev.sync(g_stream);
    dout.to(a);
    host(in.mine().data(), b.data(), count);
    mismatched_steps += std::memcmp(a.data(), b.data(), count * sizeof(T)) != 0;
  }
  CHECK(mismatched_steps == 0);
}

template <class S>
void check_graph(std::size_t count, frame_transport transport = frame_transport::automatic) {
  using C = codec<quant::absmax<4, 128>, round::stochastic>;
  const inputs<float> in(input_kind::normal, count, 77);
  collective_options o;
  o.transport = transport;
  lowbit::all_reduce<float, C, feedback::none, S, typename harness::backend> reduce(harness::comm(),
                                                                                    count, o);
  dvec<float> din(in.mine()), dout(count);
  std::vector<float> eager(count), replay(count);
  reduce.async(din.p, dout.p, count, g_stream);  // step 0, eagerly
  reduce.sync(g_stream);
  dout.to(eager);
  reduce.set_step(0);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  LOWBIT_CUDA_TRY(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
  reduce.async(din.p, dout.p, count, g_stream);  // captured: no host sync, no allocation
  LOWBIT_CUDA_TRY(cudaStreamEndCapture(g_stream, &graph));
  LOWBIT_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
  int wrong = 0;
  for (int r = 0; r < 10; ++r) {
    LOWBIT_CUDA_TRY(cudaMemsetAsync(dout.p, 0, count * sizeof(float), g_stream));
    LOWBIT_CUDA_TRY(cudaGraphLaunch(exec, g_stream));
    reduce.sync(g_stream);
    dout.to(replay);
    wrong += std::memcmp(eager.data(), replay.data(), count * sizeof(float)) != 0;
  }
  // Teardown order matters: a graph exec holding NCCL work must go before the comm.
  LOWBIT_CUDA_TRY(cudaGraphExecDestroy(exec));
  LOWBIT_CUDA_TRY(cudaGraphDestroy(graph));
  CHECK(wrong == 0);
}

}  // namespace lowbit::test
