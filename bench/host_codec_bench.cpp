// Host codec throughput, for orientation: lowbit::host::encode / decode of 4 Mi floats
// per width (absmax, blocks of 128), round to nearest and stochastic, on one thread
// (exec_policy{1}: the per-core figure; run under `taskset -c 0`); minmax beside it;
// sum_frames of two frames (the reduction of a two-rank all_reduce); and the `_threads`
// cases with the default policy (every CPU the process may run on), timed in real time.
// GB/s counts the float bytes in (encode) or out (decode, sum), decimal.
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

const lowbit::host::exec_policy one_thread{1};

template <class Codec, bool Threads = false>
void bm_encode(benchmark::State& state) {
  const auto& x = input();
  std::vector<chunk> frame(Codec::frame_bytes(count) / 16 + 1);
  lowbit::span<std::byte> f(reinterpret_cast<std::byte*>(frame.data()), frame.size() * 16);
  const lowbit::host::exec_policy policy = Threads ? lowbit::host::exec_policy{} : one_thread;
  for (auto _ : state) {
    lowbit::host::encode<Codec>(lowbit::span<const float>(x.data(), count), f, {}, 0, {}, policy);
    benchmark::DoNotOptimize(frame.data());
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(count * sizeof(float)) / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

template <class Codec, bool Threads = false>
void bm_decode(benchmark::State& state) {
  const auto& x = input();
  std::vector<chunk> frame(Codec::frame_bytes(count) / 16 + 1);
  lowbit::span<std::byte> f(reinterpret_cast<std::byte*>(frame.data()), frame.size() * 16);
  lowbit::host::encode<Codec>(lowbit::span<const float>(x.data(), count), f);
  std::vector<float> y(count);
  const lowbit::host::exec_policy policy = Threads ? lowbit::host::exec_policy{} : one_thread;
  for (auto _ : state) {
    lowbit::host::decode<Codec>(lowbit::span<const std::byte>(f.data(), f.size()),
                                lowbit::span<float>(y.data(), count), 1.0f, policy);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(count * sizeof(float)) / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

/// acc = frame 0 + frame 1, and out = acc / 2: the reduction of a two-rank all_reduce.
template <class Codec, bool Threads = false>
void bm_sum_frames(benchmark::State& state) {
  const auto& x = input();
  const std::size_t stride = Codec::frame_bytes(count);
  std::vector<chunk> frames(2 * stride / 16 + 1);
  auto* base = reinterpret_cast<std::byte*>(frames.data());
  for (int p = 0; p < 2; ++p)
    lowbit::host::encode<Codec>(lowbit::span<const float>(x.data(), count),
                                lowbit::span<std::byte>(base + p * stride, stride),
                                lowbit::rng_key{1, 0, static_cast<std::uint32_t>(p), 0});
  std::vector<float> acc(count), y(count);
  const lowbit::host::exec_policy policy = Threads ? lowbit::host::exec_policy{} : one_thread;
  for (auto _ : state) {
    lowbit::host::sum_frames<Codec>(base, stride, 2, lowbit::span<float>(acc.data(), count),
                                    y.data(), 0.5f, policy);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(count * sizeof(float)) / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

template <int B>
using nearest = lowbit::codec<lowbit::quant::absmax<B>, lowbit::round::nearest>;
template <int B>
using stochastic = lowbit::codec<lowbit::quant::absmax<B>, lowbit::round::stochastic>;
template <int B>
using minmax_nearest = lowbit::codec<lowbit::quant::minmax<B>, lowbit::round::nearest>;

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
BENCHMARK_TEMPLATE(bm_sum_frames, stochastic<4>)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(bm_encode, minmax_nearest<4>)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(bm_decode, minmax_nearest<4>)->Unit(benchmark::kMillisecond);

BENCHMARK_TEMPLATE(bm_encode, nearest<4>, true)
    ->Name("bm_encode_threads<nearest<4>>")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(bm_encode, stochastic<4>, true)
    ->Name("bm_encode_threads<stochastic<4>>")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(bm_decode, nearest<4>, true)
    ->Name("bm_decode_threads<nearest<4>>")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(bm_sum_frames, stochastic<4>, true)
    ->Name("bm_sum_frames_threads<stochastic<4>>")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
