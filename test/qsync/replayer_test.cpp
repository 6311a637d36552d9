#include <catch2/catch.hpp>

#include <vector>

#include "lowbit/qsync/replayer.hpp"

using namespace lowbit::qsync;

namespace {
device_trace chain(const std::vector<double>& cpu, const std::vector<double>& gpu) {
  device_trace t;
  for (std::size_t i = 0; i < cpu.size(); ++i) t.kernels.push_back({cpu[i], gpu[i]});
  return t;
}
}  // namespace

TEST_CASE("3-op chain: GPU-bound ends at 7.0, CPU-bound at 3.2 (REFERENCE.md)") {
  // CPU issues at 1, 2, 3. GPU [5, .5, .5]: 1->6, 6->6.5, 6.5->7.
  const auto slow = replay(chain({1, 1, 1}, {5, .5, .5}), {});
  REQUIRE(slow.iteration_ms == Approx(7.0));
  // GPU [.2, .2, .2]: each kernel waits for its launch: 1->1.2, 2->2.2, 3->3.2.
  const auto fast = replay(chain({1, 1, 1}, {.2, .2, .2}), {});
  REQUIRE(fast.iteration_ms == Approx(3.2));
  const auto s = replay_streams(chain({1, 1, 1}, {.2, .2, .2}).kernels);
  REQUIRE(s.start == std::vector<double>{1, 2, 3});
  REQUIRE(s.cpu_end == Approx(3.0));
}

TEST_CASE("buckets: 3->7, 9->11 = 11, a first all-reduce of 8 makes it 13 (FIFO)") {
  auto t = chain({0, 0, 0}, {3, 3, 3});
  t.bucket_ready = {0, 2};  // bucket 1 after op 1 (t = 3), bucket 2 after op 3 (t = 9)
  const auto a = replay(t, {4, 2});
  REQUIRE(a.bucket_start == std::vector<double>{3, 9});
  REQUIRE(a.bucket_end == std::vector<double>{7, 11});
  REQUIRE(a.iteration_ms == Approx(11));
  const auto b = replay(t, {8, 2});
  REQUIRE(b.bucket_start == std::vector<double>{3, 11});  // waits for bucket 1: FIFO
  REQUIRE(b.bucket_end == std::vector<double>{11, 13});
  REQUIRE(b.iteration_ms == Approx(13));
}

TEST_CASE("a bucket with no ready kernel is ready at 0, the tail follows the last bucket") {
  auto t = chain({0, 0}, {1, 1});
  t.bucket_ready = {no_index, 1};
  t.tail_ms = 0.5;
  const auto r = replay(t, {3, 1});
  REQUIRE(r.bucket_start == std::vector<double>{0, 3});
  REQUIRE(r.iteration_ms == Approx(4.5));
}

TEST_CASE("cross-device: buckets start at the latest ready time and last the longest") {
  auto fast = chain({0, 0, 0}, {1, 1, 1});
  auto slow = chain({0, 0, 0}, {3, 3, 3});
  fast.bucket_ready = slow.bucket_ready = {0, 2};
  fast.tail_ms = 2.0;
  slow.tail_ms = 1.0;
  const std::vector<device_timing> devs = {timing_of(slow, replay_streams(slow.kernels)),
                                           timing_of(fast, replay_streams(fast.kernels))};
  // Bucket 1: ready 3 (slow) vs 1 (fast) -> 3; lasts max(4, 1) = 4 -> 7.
  // Bucket 2: ready 9 vs 3, after 7 -> 9; lasts max(2, 5) = 5 -> 14.
  const auto r = replay_sync(devs, {{4, 2}, {1, 5}});
  REQUIRE(r.bucket_start == std::vector<double>{3, 9});
  REQUIRE(r.bucket_end == std::vector<double>{7, 14});
  // Each device ends after the shared last bucket plus its own tail.
  REQUIRE(r.device_ms == std::vector<double>{15, 16});
  REQUIRE(r.iteration_ms == Approx(16));
  REQUIRE(r.slowest == 1);
}

TEST_CASE("replay_sync rejects mismatched bucket lists") {
  auto a = chain({0}, {1});
  a.bucket_ready = {0};
  const std::vector<device_timing> devs = {timing_of(a, replay_streams(a.kernels))};
  REQUIRE_THROWS_AS(replay_sync(devs, {{1, 2}}), lowbit::invalid_argument);
  REQUIRE_THROWS_AS(replay_sync({}, {}), lowbit::invalid_argument);
}
