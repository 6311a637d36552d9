// Host codec throughput, for orientation: lowbit::host::encode / decode of 4 Mi floats
// per width (absmax, blocks of 128), round to nearest and stochastic. GB/s counts the
// float bytes in (encode) or out (decode), decimal.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "lowbit/host/codec_executor.hpp"

namespace {

constexpr std::size_t count = std::size_t{1} << 22;

const std::vector<float>& input() {
  static const std::vector<float> x = [] {
    std::mt19937 g(42);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(count);
    for (auto& e : v) e = d(g);
    return v;
  }();
  return x;
}

struct alignas(16) chunk {
  unsigned char b[16];
};

template <class Codec>
void bm_encode(benchmark::State& state) {
  const auto& x = input();
  std::vector<chunk> frame(Codec::frame_bytes(count) / 16 + 1);
  lowbit::span<std::byte> f(reinterpret_cast<std::byte*>(frame.data()), frame.size() * 16);
  for (auto _ : state) {
    lowbit::host::encode<Codec>(lowbit::span<const float>(x.data(), count), f);
    benchmark::DoNotOptimize(frame.data());
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(count * sizeof(float)) / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

template <class Codec>
void bm_decode(benchmark::State& state) {
  const auto& x = input();
  std::vector<chunk> frame(Codec::frame_bytes(count) / 16 + 1);
  lowbit::span<std::byte> f(reinterpret_cast<std::byte*>(frame.data()), frame.size() * 16);
  lowbit::host::encode<Codec>(lowbit::span<const float>(x.data(), count), f);
  std::vector<float> y(count);
  for (auto _ : state) {
    lowbit::host::decode<Codec>(lowbit::span<const std::byte>(f.data(), f.size()),
                                lowbit::span<float>(y.data(), count));
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(count * sizeof(float)) / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

template <int B>
using nearest = lowbit::codec<lowbit::quant::absmax<B>, lowbit::round::nearest>;
template <int B>
using stochastic = lowbit::codec<lowbit::quant::absmax<B>, lowbit::round::stochastic>;

}  // namespace

BENCHMARK_TEMPLATE(bm_encode, nearest<1>)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(bm_encode, nearest<2>)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(bm_encode, nearest<4>)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(bm_encode, nearest<8>)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(bm_encode, stochastic<4>)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(bm_decode, nearest<1>)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(bm_decode, nearest<2>)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(bm_decode, nearest<4>)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(bm_decode, nearest<8>)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
