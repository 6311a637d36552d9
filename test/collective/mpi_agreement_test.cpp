// Ranks that disagree, ranks that never call, sizes that cannot be represented, and one
// rank: every rank ends with a clear error within the deadline (or, on one rank, with its
// input exactly), nothing is written to an output, and nothing hangs or aborts.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "agreement_util.hpp"
#include "lowbit/collective/mpi.hpp"
#include "test_random.hpp"

namespace {

using namespace std::chrono_literals;
using lowbit::backend::mpi;
using lowbit::comm::mpi_comm;
using codec4 = lowbit::codec<lowbit::quant::absmax<4>, lowbit::round::stochastic>;
template <int B>
using codec_of = lowbit::codec<lowbit::quant::absmax<B>, lowbit::round::nearest>;

using namespace lowbit::test;

/// A fresh communicator for each case: a timeout marks the one it ran on unusable.
mpi_comm fresh_comm() { return mpi_comm::duplicate(MPI_COMM_WORLD); }

lowbit::collective_options quick(
    lowbit::all_reduce_algorithm a = lowbit::all_reduce_algorithm::automatic) {
  lowbit::collective_options o;
  o.timeout = 1500ms;
  o.algorithm = a;
  return o;
}

/// The disagreement cases need a second rank to disagree with (CMake runs them on 2 to 4).
void require_two_ranks() {
  INFO("this case needs 2 ranks or more: run it under mpirun -np 2 or more");
  REQUIRE(world_size() >= 2);
}

constexpr float sentinel = -12345.0f;

bool untouched(const std::vector<float>& v) {
  for (float x : v)
    if (x != sentinel) return false;
  return true;
}

std::vector<float> input(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = static_cast<float>(std::sin(0.01 * double(i)) + 0.1 * world_rank());
  return x;
}

}  // namespace

TEST_CASE("counts that differ within the same blocks: every rank raises, nothing is written") {
  require_two_ranks();
  for (auto alg :
       {lowbit::all_reduce_algorithm::one_shot, lowbit::all_reduce_algorithm::two_phase}) {
    mpi_comm c = fresh_comm();
    lowbit::all_reduce<float, codec4, lowbit::feedback::none, lowbit::schedule::flat, mpi> ar(
        c, 4096, quick(alg));
    const std::size_t n = last_rank() ? 1020 : 1000;
    const auto x = input(n);
    std::vector<float> y(n, sentinel);
    std::string what;
    const outcome o = run([&] { ar(x.data(), y.data(), n); }, &what);
    INFO(what);
    for (int v : gather_outcomes(o)) CHECK(v == static_cast<int>(outcome::agreement));
    CHECK(untouched(y));
    if (o == outcome::agreement && !last_rank()) CHECK(what.find("count") != std::string::npos);
    // The object is retired; the communicator is not.
    CHECK(run([&] { ar(x.data(), y.data(), n); }) == outcome::invalid);
    lowbit::all_reduce<float, codec4, lowbit::feedback::none, lowbit::schedule::flat, mpi> again(
        c, 4096, quick(alg));
    std::vector<float> z(1000, sentinel);
    const auto x2 = input(1000);
    CHECK(run([&] { again(x2.data(), z.data(), 1000); }) == outcome::ok);
    CHECK_FALSE(untouched(z));
  }
}

TEST_CASE("counts that differ in blocks and chunks: an error on every rank within the deadline") {
  require_two_ranks();
  mpi_comm c = fresh_comm();
  lowbit::all_reduce<float, codec4, lowbit::feedback::none, lowbit::schedule::pipelined<4>, mpi> ar(
      c, 8192, quick(lowbit::all_reduce_algorithm::two_phase));
  const std::size_t n = last_rank() ? 3000 : 1000;
  const auto x = input(n);
  std::vector<float> y(n, sentinel);
  const auto t0 = std::chrono::steady_clock::now();
  const outcome o = run([&] { ar(x.data(), y.data(), n); });
  const auto took = std::chrono::steady_clock::now() - t0;
  for (int v : gather_outcomes(o)) {
    CHECK(v != static_cast<int>(outcome::ok));
    CHECK(v != static_cast<int>(outcome::other));
  }
  CHECK(untouched(y));
  CHECK(took < 30s);  // bounded: the deadline is 1.5 s per wait, not forever
}

TEST_CASE("reduce_scatter and all_gather: disagreeing counts raise on every rank") {
  require_two_ranks();
  mpi_comm c = fresh_comm();
  const std::size_t n = last_rank() ? 2000 : 2048;
  const auto x = input(n);
  {
    lowbit::reduce_scatter<float, codec4, lowbit::feedback::none, lowbit::schedule::flat, mpi> rs(
        c, 4096, quick());
    std::vector<float> y(n, sentinel);
    const outcome o = run([&] { rs(x.data(), y.data(), n); });
    for (int v : gather_outcomes(o)) CHECK(v == static_cast<int>(outcome::agreement));
    CHECK(untouched(y));
  }
  {
    lowbit::all_gather<float, codec4, lowbit::schedule::flat, mpi> ag(c, 4096, quick());
    std::vector<float> y(n, sentinel);
    const outcome o = run([&] { ag(x.data(), y.data(), n); });
    for (int v : gather_outcomes(o)) {
      CHECK(v != static_cast<int>(outcome::ok));
      CHECK(v != static_cast<int>(outcome::other));
    }
    CHECK(untouched(y));
  }
}

TEST_CASE("another step, width or configuration is named on every rank") {
  require_two_ranks();
  mpi_comm c = fresh_comm();
  SECTION("step") {
    lowbit::all_reduce<float, codec4, lowbit::feedback::none, lowbit::schedule::flat, mpi> ar(
        c, 1024, quick());
    if (last_rank()) ar.set_step(7);
    const auto x = input(512);
    std::vector<float> y(512, sentinel);
    std::string what;
    const outcome o = run([&] { ar(x.data(), y.data(), 512); }, &what);
    for (int v : gather_outcomes(o)) CHECK(v == static_cast<int>(outcome::agreement));
    CHECK(what.find("step") != std::string::npos);
    CHECK(untouched(y));
  }
  SECTION("width (run-time bits)") {
    lowbit::dynamic_all_reduce<float, codec_of, lowbit::bit_widths<2, 4>, lowbit::feedback::none,
                               lowbit::schedule::flat, mpi>
        ar(c, 1024, quick());
    const auto x = input(1024);
    std::vector<float> y(1024, sentinel);
    const outcome o = run([&] { ar(x.data(), y.data(), 1024, last_rank() ? 2 : 4); });
    for (int v : gather_outcomes(o)) {
      CHECK(v != static_cast<int>(outcome::ok));
      CHECK(v != static_cast<int>(outcome::other));
    }
    CHECK(untouched(y));
  }
  SECTION("reduce op") {
    lowbit::collective_options o = quick();
    if (last_rank()) o.op = lowbit::reduce_op::avg;
    lowbit::all_reduce<float, codec4, lowbit::feedback::none, lowbit::schedule::flat, mpi> ar(
        c, 1024, o);
    const auto x = input(1024);
    std::vector<float> y(1024, sentinel);
    std::string what;
    const outcome r = run([&] { ar(x.data(), y.data(), 1024); }, &what);
    for (int v : gather_outcomes(r)) CHECK(v == static_cast<int>(outcome::agreement));
    CHECK(what.find("configuration") != std::string::npos);
  }
}

TEST_CASE("a rank over max_count or absent: the others time out, then a fresh one works") {
  require_two_ranks();
  for (int absent = 0; absent < 2; ++absent) {
    mpi_comm c = fresh_comm();
    lowbit::all_reduce<float, codec4, lowbit::feedback::none, lowbit::schedule::flat, mpi> ar(
        c, 1024, quick());
    const std::size_t n = last_rank() && !absent ? 2048 : 1000;
    const auto x = input(n);
    std::vector<float> y(n, sentinel);
    std::string what;
    const outcome o = last_rank() && absent ? outcome::invalid  // it never calls
                                            : run([&] { ar(x.data(), y.data(), n); }, &what);
    const auto all = gather_outcomes(o);
    for (int r = 0; r + 1 < world_size(); ++r) CHECK(all[r] == static_cast<int>(outcome::timeout));
    CHECK(all.back() == static_cast<int>(outcome::invalid));
    CHECK(untouched(y));
    if (!last_rank()) {
      CHECK(what.find("count 1000") != std::string::npos);
      CHECK(what.find("step 0") != std::string::npos);
      CHECK(c.unusable());
      // Later calls on that communicator fail at once.
      CHECK(run([&] { ar(x.data(), y.data(), n); }) == outcome::invalid);
    }
  }
  mpi_comm fresh = fresh_comm();
  lowbit::all_reduce<float, codec4, lowbit::feedback::none, lowbit::schedule::flat, mpi> ar(
      fresh, 1024, quick());
  const auto x = input(1000);
  std::vector<float> y(1000, sentinel);
  CHECK(run([&] { ar(x.data(), y.data(), 1000); }) == outcome::ok);
}

TEST_CASE("checked mode: a fingerprint mismatch raises on every rank before a frame moves") {
  require_two_ranks();
  mpi_comm c = fresh_comm();
  lowbit::collective_options o = quick();
  o.verify = true;
  lowbit::all_reduce<float, codec4, lowbit::feedback::none, lowbit::schedule::flat, mpi> ar(c, 8192,
                                                                                            o);
  {
    const auto x = input(4096);
    std::vector<float> y(4096, sentinel);
    REQUIRE(run([&] { ar(x.data(), y.data(), 4096); }) == outcome::ok);
  }
  const std::size_t n = last_rank() ? 3000 : 1000;
  const auto x = input(n);
  std::vector<float> y(n, sentinel);
  std::string what;
  const outcome r = run([&] { ar(x.data(), y.data(), n); }, &what);
  for (int v : gather_outcomes(r)) CHECK(v == static_cast<int>(outcome::agreement));
  CHECK(what.find("checked mode") != std::string::npos);
  CHECK(untouched(y));
  // Checked mode throws before a frame moves: the object stays usable.
  const auto x2 = input(1000);
  std::vector<float> z(1000, sentinel);
  CHECK(run([&] { ar(x2.data(), z.data(), 1000); }) == outcome::ok);
}

TEST_CASE("a workspace that cannot be represented is refused at construction") {
  mpi_comm c = fresh_comm();
  for (std::size_t m : {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX / 2, SIZE_MAX / 4 + 1}) {
    CAPTURE(m);
    std::string what;
    const outcome o = run(
        [&] {
          lowbit::all_reduce<float, codec4, lowbit::feedback::residual<float>,
                             lowbit::schedule::flat, mpi>
              ar(c, m);
        },
        &what);
    CHECK(o == outcome::invalid);
    CHECK(what.find("max_count") != std::string::npos);
  }
}

TEST_CASE("one rank: every collective returns its input exactly, feedback untouched") {
  // MPI_COMM_SELF: a communicator of one rank on every rank, whatever the job's size.
  mpi_comm c = mpi_comm::duplicate(MPI_COMM_SELF);
  REQUIRE(c.size() == 1);
  const std::size_t n = 1000;
  const auto x = input(n);
  lowbit::all_reduce<float, codec4, lowbit::feedback::residual<float>, lowbit::schedule::flat, mpi>
      ar(c, n, quick());
  std::vector<float> y(n, sentinel);
  ar(x.data(), y.data(), n);
  CHECK(y == x);
  const float* e = ar.feedback_state().worker_ref().e;
  REQUIRE(e != nullptr);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(e[i] == 0.0f);
  std::vector<float> inplace = x;
  ar(inplace.data(), inplace.data(), n);
  CHECK(inplace == x);
  lowbit::collective_options avg = quick();
  avg.op = lowbit::reduce_op::avg;
  lowbit::reduce_scatter<float, codec4, lowbit::feedback::none, lowbit::schedule::flat, mpi> rs(
      c, n, avg);
  std::vector<float> s(n, sentinel);
  rs(x.data(), s.data(), n);
  CHECK(s == x);
  lowbit::all_gather<float, codec4, lowbit::schedule::flat, mpi> ag(c, n);
  std::vector<float> g(n, sentinel);
  ag(x.data(), g.data(), n);
  CHECK(g == x);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) rc = session.run();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
