// Ranks that disagree on a device backend (NCCL's, or the node backend's): every rank ends
// with a clear error within the deadline, nothing is written to an output, nothing hangs.
//
// Every frame carries a header that the kernels consuming it check: a disagreement that
// keeps every frame's size (counts within the same blocks, another step) is raised at
// sync() on every rank, with nothing written, and retires the object; checked mode
// (collective_options::verify) raises before a frame moves. A rank that throws before it
// sends, or never calls, makes the others time out at sync()'s deadline in either mode,
// and the communicator is aborted.
//
// The including test defines `backend` (the tag), `fresh_comm()` (a new communicator over
// MPI_COMM_WORLD: a timeout aborts the one it ran on) and g_stream, then includes this.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "agreement_util.hpp"

namespace {

using namespace std::chrono_literals;
using codec4 = lowbit::codec<lowbit::quant::absmax<4>, lowbit::round::stochastic>;
using all_reduce4 =
    lowbit::all_reduce<float, codec4, lowbit::feedback::none, lowbit::schedule::flat, backend>;

using namespace lowbit::test;

lowbit::collective_options quick(bool verify) {
  lowbit::collective_options o;
  o.timeout = 3000ms;
  o.verify = verify;
  return o;
}

constexpr float sentinel = -12345.0f;

/// Device buffers of `n` floats: an input and an output filled with the sentinel.
struct buffers {
  float* in = nullptr;
  float* out = nullptr;
  std::size_t n = 0;
  explicit buffers(std::size_t n_) : n(n_) {
    std::vector<float> x(n), s(n, sentinel);
    for (std::size_t i = 0; i < n; ++i)
      x[i] = static_cast<float>(std::sin(0.01 * double(i)) + 0.1 * world_rank());
    LOWBIT_CUDA_TRY(cudaMalloc(&in, n * sizeof(float)));
    LOWBIT_CUDA_TRY(cudaMalloc(&out, n * sizeof(float)));
    LOWBIT_CUDA_TRY(cudaMemcpy(in, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    LOWBIT_CUDA_TRY(cudaMemcpy(out, s.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    // Pageable copies may return before their DMA lands; the calls run on a non-blocking
    // stream.
    LOWBIT_CUDA_TRY(cudaDeviceSynchronize());
  }
  buffers(const buffers&) = delete;
  ~buffers() {
    cudaFree(in);
    cudaFree(out);
  }
  bool untouched() const {
    std::vector<float> y(n);
    LOWBIT_CUDA_TRY(cudaMemcpy(y.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (float v : y)
      if (v != sentinel) return false;
    return true;
  }
};

}  // namespace

TEST_CASE("checked mode: counts that differ raise on every rank, nothing is written") {
  if (world_size() < 2) return;
  for (std::size_t other : {std::size_t{1020}, std::size_t{3000}}) {  // same blocks, and not
    auto c = fresh_comm();
    all_reduce4 ar(c, 4096, quick(true));
    const std::size_t n = last_rank() ? other : 1000;
    buffers b(n);
    std::string what;
    const outcome o = run([&] { ar(b.in, b.out, n, g_stream); }, &what);
    INFO(what);
    for (int v : gather_outcomes(o)) CHECK(v == static_cast<int>(outcome::agreement));
    CHECK(b.untouched());
    if (!last_rank()) CHECK(what.find("count") != std::string::npos);
    // Checked mode throws before a frame moves: the object and the communicator stay
    // usable.
    buffers b2(1000);
    CHECK(run([&] { ar(b2.in, b2.out, 1000, g_stream); }) == outcome::ok);
    CHECK_FALSE(b2.untouched());
  }
}

TEST_CASE("checked mode: another step is named on every rank") {
  if (world_size() < 2) return;
  auto c = fresh_comm();
  all_reduce4 ar(c, 1024, quick(true));
  if (last_rank()) ar.set_step(7);
  buffers b(512);
  std::string what;
  const outcome o = run([&] { ar(b.in, b.out, 512, g_stream); }, &what);
  for (int v : gather_outcomes(o)) CHECK(v == static_cast<int>(outcome::agreement));
  CHECK(what.find("step") != std::string::npos);
  CHECK(b.untouched());
}

TEST_CASE(
    "frame headers: a disagreement that keeps every frame's size raises on "
    "every rank, nothing is written, the communicator stays usable") {
  if (world_size() < 2) return;
  using lowbit::all_reduce_algorithm;
  for (all_reduce_algorithm algo :
       {all_reduce_algorithm::one_shot, all_reduce_algorithm::two_phase})
    for (const char* differs : {"count", "step"}) {
      INFO(lowbit::to_string(algo) << ", another " << differs);
      auto c = fresh_comm();
      lowbit::collective_options o = quick(false);
      o.algorithm = algo;
      all_reduce4 ar(c, 4096, o);
      const bool count_differs = std::string(differs) == "count";
      if (!count_differs && last_rank()) ar.set_step(7);
      const std::size_t n = count_differs && last_rank() ? 1020 : 1000;  // the same blocks
      buffers b(n);
      std::string what;
      const outcome got = run([&] { ar(b.in, b.out, n, g_stream); }, &what);
      INFO(what);
      for (int v : gather_outcomes(got)) CHECK(v == static_cast<int>(outcome::agreement));
      CHECK(what.find(differs) != std::string::npos);
      CHECK(b.untouched());
      // The object is retired; the communicator is not.
      CHECK(run([&] { ar(b.in, b.out, n, g_stream); }) == outcome::invalid);
      all_reduce4 again(c, 4096, o);
      buffers b2(1000);
      CHECK(run([&] { again(b2.in, b2.out, 1000, g_stream); }) == outcome::ok);
      CHECK_FALSE(b2.untouched());
    }
}

TEST_CASE("frame headers: reduce_scatter and all_gather raise alike") {
  if (world_size() < 2) return;
  using rs4 = lowbit::reduce_scatter<float, codec4, lowbit::feedback::none, lowbit::schedule::flat,
                                     backend>;
  using ag4 = lowbit::all_gather<float, codec4, lowbit::schedule::flat, backend>;
  auto c = fresh_comm();
  rs4 rs(c, 4096, quick(false));
  ag4 ag(c, 4096, quick(false));
  if (last_rank()) {
    rs.set_step(3);
    ag.set_step(3);
  }
  buffers b(1000);
  std::string what;
  CHECK(run([&] { rs(b.in, b.out, 1000, g_stream); }, &what) == outcome::agreement);
  CHECK(what.find("step") != std::string::npos);
  CHECK(run([&] { ag(b.in, b.out, 1000, g_stream); }, &what) == outcome::agreement);
  CHECK(what.find("step") != std::string::npos);
  CHECK(b.untouched());
}

TEST_CASE("a rank over max_count or absent makes the others time out, then a fresh one works") {
  if (world_size() < 2) return;
  for (int absent = 0; absent < 2; ++absent) {
    auto c = fresh_comm();
    all_reduce4 ar(c, 1024, quick(false));
    const std::size_t n = last_rank() && !absent ? 2048 : 1000;
    buffers b(n);
    std::string what;
    const auto t0 = std::chrono::steady_clock::now();
    const outcome o = last_rank() && absent ? outcome::invalid  // it never calls
                                            : run([&] { ar(b.in, b.out, n, g_stream); }, &what);
    const auto took = std::chrono::steady_clock::now() - t0;
    const auto all = gather_outcomes(o);
    for (int r = 0; r + 1 < world_size(); ++r) CHECK(all[r] == static_cast<int>(outcome::timeout));
    CHECK(all.back() == static_cast<int>(outcome::invalid));
    CHECK(took < 60s);  // bounded by the 3 s deadline, not forever
    if (!last_rank()) {
      INFO(what);
      CHECK(what.find("count 1000") != std::string::npos);
      CHECK(c.aborted());
      // Later calls on that communicator fail at once.
      CHECK(run([&] { ar(b.in, b.out, n, g_stream); }) == outcome::invalid);
    }
    // What the aborted communicator's kernels left on the stream is gone before the next
    // case (an error here is the aborted work's, not the next case's).
    cudaStreamSynchronize(g_stream);
    cudaGetLastError();
  }
  auto fresh = fresh_comm();
  all_reduce4 ar(fresh, 1024, quick(false));
  buffers b(1000);
  CHECK(run([&] { ar(b.in, b.out, 1000, g_stream); }) == outcome::ok);
  CHECK_FALSE(b.untouched());
}
