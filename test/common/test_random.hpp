// Seeded random inputs for tests: a fresh seed each run, printed so that a failure
// can be replayed with LOWBIT_TEST_SEED=<seed>.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace lowbit::test {

/// The run's seed: LOWBIT_TEST_SEED if set, otherwise drawn once and printed.
inline std::uint64_t seed() {
  static const std::uint64_t s = [] {
    std::uint64_t v;
    if (const char* env = std::getenv("LOWBIT_TEST_SEED")) {
      v = std::strtoull(env, nullptr, 10);
    } else {
      v = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    }
    std::printf("lowbit test seed: LOWBIT_TEST_SEED=%llu\n", static_cast<unsigned long long>(v));
    std::fflush(stdout);
    return v;
  }();
  return s;
}

/// A generator seeded from the run's seed and a per-use salt.
inline std::mt19937_64 rng(std::uint64_t salt = 0) {
  return std::mt19937_64(seed() ^ (salt * 0x9e3779b97f4a7c15ull));
}

/// `count` normal(mean, stddev) floats.
inline std::vector<float> normal(std::size_t count, float stddev = 1.0f, float mean = 0.0f,
                                 std::uint64_t salt = 0) {
  auto g = rng(salt);
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(count);
  for (auto& x : v) x = d(g);
  return v;
}

/// `count` uniform floats in [lo, hi).
inline std::vector<float> uniform(std::size_t count, float lo, float hi, std::uint64_t salt = 0) {
  auto g = rng(salt);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(count);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace lowbit::test
