#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <vector>

#include "lowbit/schedule/schedule.hpp"

using namespace lowbit;

TEST_CASE("shards are whole blocks that cover the tensor once, in rank order") {
  for (std::size_t block : {32u, 128u}) {
    for (int P : {1, 2, 3, 4, 7}) {
      for (std::size_t count : {0ul, 1ul, 31ul, 33ul, 127ul, 128ul, 1000ul, 4099ul, 100003ul}) {
        std::size_t next = 0, biggest = 0;
        for (int p = 0; p < P; ++p) {
          const auto s = schedule::shard(count, block, P, p);
          CHECK(s.begin == next);
          if (s.count > 0) CHECK(s.begin % block == 0);       // empty shards sit at the end
          if (s.end() != count) CHECK(s.count % block == 0);  // only the last one is partial
          if (p == 0) biggest = s.count;
          CHECK(s.count <= biggest + 0);  // the first shard is the largest
          next = s.end();
        }
        CHECK(next == count);
      }
    }
  }
}

TEST_CASE("pieces cut a shard into whole blocks, and chunks never outnumber blocks per rank") {
  using S = schedule::pipelined<4, 1>;
  const std::size_t block = 64;
  for (int P : {1, 2, 3, 4}) {
    for (std::size_t count : {1ul, 100ul, 64ul * 4 * 3 + 5, 100003ul}) {
      const int K = schedule::num_chunks<S>(count, block, P);
      CHECK(K >= 1);
      CHECK(K <= 4);
      CHECK(schedule::num_chunks<schedule::flat>(count, block, P) == 1);
      for (int p = 0; p < P; ++p) {
        const auto s = schedule::shard(count, block, P, p);
        std::size_t next = s.begin;
        for (int k = 0; k < K; ++k) {
          const auto pc = schedule::piece<S>(s, block, K, k);
          CHECK(pc.begin == next);
          if (pc.count > 0) CHECK(pc.begin % block == 0);
          next = pc.end();
        }
        CHECK(next == s.end());
      }
    }
  }
}

TEST_CASE("the default pipeline keeps chunks of at least 2^25 values") {
  using S = schedule::pipelined<4>;
  const std::size_t m = std::size_t{1} << 25;
  CHECK(schedule::num_chunks<S>(m - 1, 128, 2) == 1);
  CHECK(schedule::num_chunks<S>(2 * m, 128, 2) == 2);
  CHECK(schedule::num_chunks<S>(64 * m, 128, 8) == 4);
}

TEST_CASE("ramped chunks weigh 1:2:4:...:4:2:1 and cover each shard in whole blocks") {
  CHECK(schedule::ramp_total(1) == 1);
  CHECK(schedule::ramp_total(4) == 6);   // 1 2 2 1
  CHECK(schedule::ramp_total(5) == 10);  // 1 2 4 2 1
  CHECK(schedule::ramp_total(8) == 22);  // 1 2 4 4 4 4 2 1
  using S = schedule::ramped<8, 1>;
  const std::size_t block = 32;
  for (int P : {1, 2, 3, 8}) {
    for (std::size_t count : {1ul, 100ul, 32ul * 22 * 3 + 5, 100003ul, 1000000ul}) {
      const int K = schedule::num_chunks<S>(count, block, P);
      CHECK(K >= 1);
      CHECK(K <= 8);
      const std::size_t per_rank = (count + block - 1) / block / P;
      if (K > 1) CHECK(schedule::ramp_total(K) <= per_rank);
      if (K < 8) CHECK(schedule::ramp_total(K + 1) > per_rank);
      for (int p = 0; p < P; ++p) {
        const auto s = schedule::shard(count, block, P, p);
        std::size_t next = s.begin;
        for (int k = 0; k < K; ++k) {
          const auto pc = schedule::piece<S>(s, block, K, k);
          CHECK(pc.begin == next);
          if (pc.count > 0) CHECK(pc.begin % block == 0);
          if (s.count >= schedule::ramp_total(K) * block) {
            CHECK(pc.count > 0);
            // in proportion to the weights, within a block (and the last one's cut)
            const double share =
                double(s.count) * schedule::ramp_weight(K, k) / double(schedule::ramp_total(K));
            CHECK(std::abs(double(pc.count) - share) <= 2.0 * double(block));
          }
          next = pc.end();
        }
        CHECK(next == s.end());
      }
    }
  }
}

TEST_CASE("the default schedule keeps each rank's lightest chunk at 2^24 values") {
  using S = schedule::default_schedule;
  const std::size_t m = std::size_t{1} << 24;
  CHECK(schedule::num_chunks<S>(2 * m - 1, 128, 1) == 1);
  CHECK(schedule::num_chunks<S>(2 * m, 128, 1) == 2);   // 1:1
  CHECK(schedule::num_chunks<S>(8 * m, 128, 1) == 4);   // 1:2:2:1, 2^27 values
  CHECK(schedule::num_chunks<S>(8 * m, 128, 2) == 3);   // 1:2:1 of 2^26 each
  CHECK(schedule::num_chunks<S>(32 * m, 128, 1) == 8);  // 2^29 values
  CHECK(schedule::num_chunks<S>(16 * m, 128, 1) == 6);  // 2^28: 1:2:4:4:2:1
  CHECK(schedule::piece<S>({0, 8 * m}, 128, 4, 0).count == (8 * m / 128 / 6) * 128);
}

TEST_CASE("schedule policies are recognised") {
  STATIC_REQUIRE(schedule::is_schedule_policy_v<schedule::flat>);
  STATIC_REQUIRE(schedule::is_schedule_policy_v<schedule::pipelined<2, 1>>);
  STATIC_REQUIRE(schedule::is_schedule_policy_v<schedule::ramped<>>);
  STATIC_REQUIRE(schedule::ramps_v<schedule::ramped<>>);
  STATIC_REQUIRE_FALSE(schedule::ramps_v<schedule::pipelined<>>);
  STATIC_REQUIRE_FALSE(schedule::is_schedule_policy_v<int>);
}

TEST_CASE("equal_shard is the shard size exactly when every rank's shard has it") {
  for (const int P : {1, 2, 3, 4, 8})
    for (const std::size_t block : {std::size_t{32}, std::size_t{128}})
      for (std::size_t count = 0; count <= 4 * block * static_cast<std::size_t>(P) + 3;
           count += 7) {
        bool equal = true;
        for (int p = 0; p < P; ++p)
          equal = equal && schedule::shard(count, block, P, p).count * P == count &&
                  schedule::shard(count, block, P, p).begin == count / P * p;
        INFO("P " << P << " block " << block << " count " << count);
        REQUIRE(schedule::equal_shard(count, block, P) == (equal && count > 0 ? count / P : 0));
      }
}
