// Throughput of the CUDA codec kernels on one GPU: encode, decode and
// decode-accumulate-encode (P = 2) for fp32 and bf16 inputs of 1 MiB .. 1 GiB at widths
// 1, 2, 4, 8 (absmax, blocks of 128, round to nearest; one stochastic-rounding row set
// at 4 bits), timed with CUDA events (Google Benchmark manual time).
//
// GB/s counts the bytes a pass must move through device memory (decimal):
//   encode  count*sizeof(T) read + frame_bytes written
//   decode  frame_bytes read + count*sizeof(T) written
//   dae     2 frames read + 1 frame written
// The _slot and _hdr rows run decode and dae_p2 on frames behind their 32-byte headers, as
// a collective lays them out; the _hdr rows also check the headers in the kernel, as a
// collective does: their ratio is the check's cost.
// `ratio` divides it by a device-to-device cudaMemcpy of the same input size measured
// in the same run (2 * size bytes per copy). Inputs rotate over disjoint regions of a
// 1 GiB buffer so that small sizes are not served from L2 run after run.
//
// reduce_pP (P = 2, 4, 8) is the one-shot fused reduce, kernels::decode_accumulate: P
// frames read, summed in fp32, count*sizeof(T) written (GB/s counts both).
// hdr_cost_* rows are derived: the _hdr row's GB/s over the _slot row's, same op and size.
//
// Flags: Google Benchmark's own (--benchmark_filter, --benchmark_out=...), and
//   --summary_csv=PATH   also write the summary as CSV (op, type, bits, size_bytes, GB/s,
//                        copy_GB/s, ratio, target, date, commit): scripts/codec-table turns
//                        a committed one under docs/perf/ into docs/performance.md's table
//   --commit=REV         the commit column (default: $LOWBIT_COMMIT, else "unknown")
// At the end a summary table is printed: op, type, bits, size, GB/s, copy GB/s, ratio,
// target and met/MISSED. Targets (docs/performance.md; ratio to the copy, rows >= 64 MiB):
// target_of() below.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "lowbit/codec/frame_header.hpp"
#include "lowbit/kernels/frame_check.cuh"
#include "lowbit/kernels/kernels.cuh"

namespace {

#define BENCH_CUDA(call)                                                                          \
  do {                                                                                            \
    cudaError_t s_ = (call);                                                                      \
    if (s_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(s_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t max_bytes = 1024 * MiB;

/// Pseudo-random gradients: a hash of the index mapped to (-1, 1), times a per-block
/// scale between 2^-8 and 2^8, so the codec sees real data, never zeros.
template <class T>
__global__ void fill(T* x, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 15;
    h *= 0x85EBCA77u;
    h ^= h >> 13;
    std::uint32_t b = static_cast<std::uint32_t>(i >> 7) * 0xC2B2AE3Du ^ seed;
    b ^= b >> 16;
    const float u = static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
    const float scale = exp2f(static_cast<float>(static_cast<int>(b % 17) - 8));
    x[i] = lowbit::from_float<T>(u * scale);
  }
}

struct buffers {
  void* in = nullptr;           // 1 GiB of fp32 input
  void* in_bf16 = nullptr;      // 1 GiB of bf16 input
  void* out = nullptr;          // 1 GiB output
  std::byte* frames = nullptr;  // room for 2 frames of 1 GiB of fp32 at 8 bits + rotation
  std::size_t frames_bytes = 0;
  cudaEvent_t start{}, stop{};
};
buffers& bufs() {
  static buffers b;
  return b;
}

/// Times `op(iteration)` with CUDA events, one iteration per benchmark iteration; sets
/// the counters from the bytes moved.
void run_timed(benchmark::State& state, double bytes, double copy_gbps,
               const std::function<void(std::size_t)>& op) {
  auto& b = bufs();
  for (int w = 0; w < 3; ++w) op(static_cast<std::size_t>(w));  // warm-up
  BENCH_CUDA(cudaDeviceSynchronize());
  double seconds = 0.0;
  std::size_t it = 0;
  for (auto _ : state) {
    BENCH_CUDA(cudaEventRecord(b.start));
    op(it++);
    BENCH_CUDA(cudaEventRecord(b.stop));
    BENCH_CUDA(cudaEventSynchronize(b.stop));
    float ms = 0.0f;
    BENCH_CUDA(cudaEventElapsedTime(&ms, b.start, b.stop));
    state.SetIterationTime(ms * 1e-3);
    seconds += ms * 1e-3;
  }
  const double gbps = bytes * static_cast<double>(it) / seconds / 1e9;
  state.counters["GB/s"] = gbps;
  state.counters["copy_GB/s"] = copy_gbps;
  state.counters["ratio"] = copy_gbps > 0 ? gbps / copy_gbps : 0.0;
  state.counters["bytes"] = bytes;
}

/// The write-only roofline of a pass that mostly writes (a decode writes 2 or 4 bytes a
/// value and reads 1/8 to 1 of a byte): 16-byte stores of values that differ, in a grid
/// shaped as the decode's (4 CTAs of 8 warps an SM, 8 waves), no reads.
__global__ void write_only(float4* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float v = static_cast<float>(i);
    out[i] = make_float4(v, v, v, v);
  }
}

/// Regions of `size` bytes to rotate over inside a buffer of `total` bytes.
std::size_t regions(std::size_t size, std::size_t total) {
  return std::max<std::size_t>(1, std::min<std::size_t>(8, total / std::max<std::size_t>(size, 1)));
}

/// Median device-to-device copy bandwidth (read + write) for `size` bytes.
double copy_gbps(std::size_t size) {
  static std::map<std::size_t, double> cache;
  auto it = cache.find(size);
  if (it != cache.end()) return it->second;
  auto& b = bufs();
  const std::size_t r = regions(size, max_bytes);
  std::vector<float> t;
  for (int i = 0; i < 25; ++i) {
    const std::size_t k = static_cast<std::size_t>(i) % r;
    BENCH_CUDA(cudaEventRecord(b.start));
    BENCH_CUDA(cudaMemcpyAsync(static_cast<char*>(b.out) + k * size,
                               static_cast<const char*>(b.in) + k * size, size,
                               cudaMemcpyDeviceToDevice));
    BENCH_CUDA(cudaEventRecord(b.stop));
    BENCH_CUDA(cudaEventSynchronize(b.stop));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, b.start, b.stop));
    if (i >= 5) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  const double g = 2.0 * static_cast<double>(size) / (t[t.size() / 2] * 1e-3) / 1e9;
  cache[size] = g;
  return g;
}

/// The input of element type T, `offset` bytes in.
template <class T>
const T* input(std::size_t offset) {
  const void* base = sizeof(T) == 4 ? bufs().in : bufs().in_bf16;
  return reinterpret_cast<const T*>(static_cast<const char*>(base) + offset);
}

struct row {
  std::string op, type;
  int bits;
  std::size_t size;
  double gbps, copy, ratio;
};
/// One row per benchmark: Google Benchmark calls a benchmark several times while it
/// sizes the iteration count, and the last call (the reported one) wins.
struct row_table {
  std::vector<row> rows;
  void push_back(const row& r) {
    for (row& old : rows)
      if (old.op == r.op && old.type == r.type && old.bits == r.bits && old.size == r.size) {
        old = r;
        return;
      }
    rows.push_back(r);
  }
};
row_table& rows() {
  static row_table r;
  return r;
}

template <class Codec, class T>
void register_codec(const char* tname, std::size_t size, bool sr_only) {
  using decoder = lowbit::codec<typename Codec::quantizer_type>;
  const std::size_t count = size / sizeof(T);
  const std::size_t fbytes = lowbit::align16(Codec::frame_bytes(count));
  const int bits = Codec::bits;
  const std::string suffix = std::string("/") + tname + "/b" + std::to_string(bits) + "/" +
                             std::to_string(size / MiB) + "MiB";
  const std::string enc_name = sr_only ? "encode_sr" : "encode";

  benchmark::RegisterBenchmark(
      (enc_name + suffix).c_str(),
      [=](benchmark::State& st) {
        auto& b = bufs();
        const std::size_t r = std::min(regions(size, max_bytes), regions(fbytes, b.frames_bytes));
        const double bytes = static_cast<double>(size + Codec::frame_bytes(count));
        const double copy = copy_gbps(size);
        run_timed(st, bytes, copy, [&](std::size_t i) {
          const std::size_t k = i % r;
          lowbit::kernels::encode<Codec>(input<T>(k * size), count, b.frames + k * fbytes,
                                         lowbit::rng_key{1, static_cast<std::uint32_t>(i), 0, 0}, 0,
                                         lowbit::feedback::none_ref{}, nullptr);
        });
        rows().push_back(
            {enc_name, tname, bits, size, st.counters["GB/s"], copy, st.counters["ratio"]});
      })
      ->UseManualTime()
      ->MinTime(0.1)
      ->Unit(benchmark::kMicrosecond);
  if (sr_only) return;

  benchmark::RegisterBenchmark(
      ("decode" + suffix).c_str(),
      [=](benchmark::State& st) {
        auto& b = bufs();
        const std::size_t r = std::min(regions(size, max_bytes), regions(fbytes, b.frames_bytes));
        for (std::size_t k = 0; k < r; ++k)
          lowbit::kernels::encode<Codec>(input<T>(k * size), count, b.frames + k * fbytes,
                                         lowbit::rng_key{}, 0, lowbit::feedback::none_ref{},
                                         nullptr);
        const double bytes = static_cast<double>(size + Codec::frame_bytes(count));
        const double copy = copy_gbps(size);
        run_timed(st, bytes, copy, [&](std::size_t i) {
          const std::size_t k = i % r;
          lowbit::kernels::decode<decoder>(
              b.frames + k * fbytes, count,
              reinterpret_cast<T*>(static_cast<char*>(b.out) + k * size), 1.0f, nullptr);
        });
        rows().push_back(
            {"decode", tname, bits, size, st.counters["GB/s"], copy, st.counters["ratio"]});
      })
      ->UseManualTime()
      ->MinTime(0.1)
      ->Unit(benchmark::kMicrosecond);

  benchmark::RegisterBenchmark(
      ("dae_p2" + suffix).c_str(),
      [=](benchmark::State& st) {
        auto& b = bufs();
        // Frames p = 0, 1 at stride fbytes, then the output frame; rotate over sets of 3.
        const std::size_t set = 3 * fbytes;
        const std::size_t r =
            std::max<std::size_t>(1, std::min<std::size_t>(8, b.frames_bytes / set));
        for (std::size_t k = 0; k < r; ++k)
          for (int p = 0; p < 2; ++p)
            lowbit::kernels::encode<Codec>(input<T>(0), count, b.frames + k * set + p * fbytes,
                                           lowbit::rng_key{0, 0, static_cast<std::uint32_t>(p), 0},
                                           0, lowbit::feedback::none_ref{}, nullptr);
        const double bytes = 3.0 * static_cast<double>(Codec::frame_bytes(count));
        const double copy = copy_gbps(size);
        run_timed(st, bytes, copy, [&](std::size_t i) {
          const std::size_t k = i % r;
          lowbit::kernels::decode_accumulate_encode<Codec>(
              b.frames + k * set, fbytes, 2, count, b.frames + k * set + 2 * fbytes,
              lowbit::rng_key{2, static_cast<std::uint32_t>(i), 0, 1}, 0,
              lowbit::feedback::none_ref{}, nullptr, nullptr);
        });
        rows().push_back(
            {"dae_p2", tname, bits, size, st.counters["GB/s"], copy, st.counters["ratio"]});
      })
      ->UseManualTime()
      ->MinTime(0.1)
      ->Unit(benchmark::kMicrosecond);
}

/// The one-shot fused reduce: kernels::decode_accumulate of P frames into T (the
/// reduce_scatter half, and a one-shot all-reduce's whole reduction), P = 2, 4, 8.
template <class Codec, class T>
void register_fused_reduce(const char* tname, std::size_t size) {
  using decoder = lowbit::codec<typename Codec::quantizer_type>;
  const std::size_t count = size / sizeof(T);
  const std::size_t fbytes = lowbit::align16(Codec::frame_bytes(count));
  for (int P : {2, 4, 8}) {
    // P frames per set; rotate over as many sets as fit (at least one: the buffer holds 6
    // 8-bit frames of 1 GiB of fp32, so 8 frames fit up to 4 bits, or below 1 GiB).
    if (static_cast<std::size_t>(P) * fbytes > bufs().frames_bytes) continue;
    const std::string op = "reduce_p" + std::to_string(P);
    const std::string name = op + "/" + tname + "/b" + std::to_string(Codec::bits) + "/" +
                             std::to_string(size / MiB) + "MiB";
    benchmark::RegisterBenchmark(
        name.c_str(),
        [=](benchmark::State& st) {
          auto& b = bufs();
          const std::size_t set = static_cast<std::size_t>(P) * fbytes;
          const std::size_t r = std::max<std::size_t>(
              1, std::min<std::size_t>(regions(size, max_bytes), b.frames_bytes / set));
          for (std::size_t k = 0; k < r; ++k)
            for (int p = 0; p < P; ++p)
              lowbit::kernels::encode<Codec>(
                  input<T>(0), count, b.frames + k * set + static_cast<std::size_t>(p) * fbytes,
                  lowbit::rng_key{0, 0, static_cast<std::uint32_t>(p), 0}, 0,
                  lowbit::feedback::none_ref{}, nullptr);
          const double bytes =
              static_cast<double>(P) * static_cast<double>(Codec::frame_bytes(count)) +
              static_cast<double>(size);
          const double copy = copy_gbps(size);
          run_timed(st, bytes, copy, [&](std::size_t i) {
            const std::size_t k = i % r;
            lowbit::kernels::decode_accumulate<decoder>(
                b.frames + k * set, fbytes, P, count,
                reinterpret_cast<T*>(static_cast<char*>(b.out) +
                                     (i % regions(size, max_bytes)) * size),
                1.0f, nullptr);
          });
          rows().push_back(
              {op, tname, Codec::bits, size, st.counters["GB/s"], copy, st.counters["ratio"]});
        })
        ->UseManualTime()
        ->MinTime(0.1)
        ->Unit(benchmark::kMicrosecond);
  }
}

/// The header every frame of a 2-rank call carries, from rank `rank`.
lowbit::detail::frame_header bench_header(std::uint32_t rank, std::size_t count) {
  lowbit::detail::frame_header h;
  h.magic = lowbit::detail::frame_magic;
  h.count = count;
  h.bits = 4;
  h.rank = rank;
  return h;
}

/// Where the checked passes would record a disagreement (none happens here).
lowbit::kernels::header_mismatch* bench_record() {
  static lowbit::kernels::header_mismatch* r = [] {
    lowbit::kernels::header_mismatch* p = nullptr;
    BENCH_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&p), sizeof *p, cudaHostAllocMapped));
    *p = lowbit::kernels::header_mismatch{};
    return p;
  }();
  return r;
}

/// decode and dae_p2 as a collective runs them: every frame behind its 32-byte header, the
/// dae writing its output's. The _slot rows leave the headers unchecked, the _hdr rows check
/// both frames' headers in the consuming kernel: the same layout and bytes, so the ratio of
/// the two rows is the cost of the check alone (the plain rows' frames sit elsewhere in
/// memory and L2).
template <class Codec, class T>
void register_with_headers(const char* tname, std::size_t size, bool checked) {
  using decoder = lowbit::codec<typename Codec::quantizer_type>;
  constexpr std::size_t H = sizeof(lowbit::detail::frame_header);
  const std::size_t count = size / sizeof(T);
  const std::size_t slot = H + lowbit::align16(Codec::frame_bytes(count));
  const std::string tag = checked ? "_hdr" : "_slot";
  const std::string suffix = std::string("/") + tname + "/b" + std::to_string(Codec::bits) + "/" +
                             std::to_string(size / MiB) + "MiB";
  const auto prepare = [=](std::byte* base) {
    for (std::uint32_t p = 0; p < 2; ++p)
      lowbit::kernels::encode<Codec>(input<T>(0), count, base + p * slot + H,
                                     lowbit::rng_key{0, 0, p, 0}, 0, lowbit::feedback::none_ref{},
                                     nullptr, {base + p * slot, bench_header(p, count)});
  };
  const auto check = [=](const std::byte* base) {
    return checked ? lowbit::kernels::header_check{{base, slot, 2, bench_header(0, count)},
                                                   bench_record()}
                   : lowbit::kernels::header_check{};
  };
  benchmark::RegisterBenchmark(
      ("decode" + tag + suffix).c_str(),
      [=](benchmark::State& st) {
        auto& b = bufs();
        const std::size_t set = 2 * slot;
        const std::size_t r =
            std::max<std::size_t>(1, std::min(regions(size, max_bytes), b.frames_bytes / set));
        for (std::size_t k = 0; k < r; ++k) prepare(b.frames + k * set);
        const double bytes = static_cast<double>(size + Codec::frame_bytes(count));
        const double copy = copy_gbps(size);
        run_timed(st, bytes, copy, [&](std::size_t i) {
          const std::size_t k = i % r;
          lowbit::kernels::decode<decoder>(
              b.frames + k * set + H, count,
              reinterpret_cast<T*>(static_cast<char*>(b.out) +
                                   (i % regions(size, max_bytes)) * size),
              1.0f, nullptr, check(b.frames + k * set));
        });
        rows().push_back({"decode" + tag, tname, Codec::bits, size, st.counters["GB/s"], copy,
                          st.counters["ratio"]});
      })
      ->UseManualTime()
      ->MinTime(0.1)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(
      ("dae_p2" + tag + suffix).c_str(),
      [=](benchmark::State& st) {
        auto& b = bufs();
        const std::size_t set = 3 * slot;
        const std::size_t r =
            std::max<std::size_t>(1, std::min<std::size_t>(8, b.frames_bytes / set));
        for (std::size_t k = 0; k < r; ++k) prepare(b.frames + k * set);
        const double bytes = 3.0 * static_cast<double>(Codec::frame_bytes(count));
        const double copy = copy_gbps(size);
        run_timed(st, bytes, copy, [&](std::size_t i) {
          std::byte* base = b.frames + (i % r) * set;
          lowbit::kernels::decode_accumulate_encode<Codec>(
              base + H, slot, 2, count, base + 2 * slot + H,
              lowbit::rng_key{2, static_cast<std::uint32_t>(i), 0, 1}, 0,
              lowbit::feedback::none_ref{}, nullptr, nullptr,
              {check(base), {base + 2 * slot, bench_header(0, count)}});
        });
        rows().push_back({"dae_p2" + tag, tname, Codec::bits, size, st.counters["GB/s"], copy,
                          st.counters["ratio"]});
      })
      ->UseManualTime()
      ->MinTime(0.1)
      ->Unit(benchmark::kMicrosecond);
}

template <int Bits>
using absmax_nearest = lowbit::codec<lowbit::quant::absmax<Bits>, lowbit::round::nearest>;
using absmax4_sr = lowbit::codec<lowbit::quant::absmax<4>, lowbit::round::stochastic>;

template <class T>
void register_type(const char* tname, std::size_t size) {
  register_codec<absmax_nearest<1>, T>(tname, size, false);
  register_codec<absmax_nearest<2>, T>(tname, size, false);
  register_codec<absmax_nearest<4>, T>(tname, size, false);
  register_codec<absmax_nearest<8>, T>(tname, size, false);
  register_codec<absmax4_sr, T>(tname, size, true);
  register_with_headers<absmax_nearest<4>, T>(tname, size, false);
  register_with_headers<absmax_nearest<4>, T>(tname, size, true);
  register_fused_reduce<absmax_nearest<4>, T>(tname, size);
  register_fused_reduce<absmax_nearest<8>, T>(tname, size);
}

/// Launch-policy sweep at one size: the same passes under other CTA sizes and grid
/// caps (the policy does not change the bytes written, only the speed).
template <class Codec, class T>
void register_policy_sweep(const char* tname, std::size_t size) {
  using decoder = lowbit::codec<typename Codec::quantizer_type>;
  const std::size_t count = size / sizeof(T);
  const std::size_t fbytes = lowbit::align16(Codec::frame_bytes(count));
  const lowbit::kernels::launch_policy policies[] = {
      {256, 32, 2, 4}, {256, 32, 4, 8}, {128, 32, 8, 4}, {256, 32, 6, 1}, {64, 32, 16, 4}};
  for (const auto pol : policies) {
    const std::string suffix = std::string("/") + tname + "/b" + std::to_string(Codec::bits) + "/" +
                               std::to_string(size / MiB) + "MiB/t" +
                               std::to_string(pol.threads_per_block) + "x" +
                               std::to_string(pol.blocks_per_sm) + "x" + std::to_string(pol.waves);
    benchmark::RegisterBenchmark(
        ("policy_encode" + suffix).c_str(),
        [=](benchmark::State& st) {
          auto& b = bufs();
          run_timed(st, static_cast<double>(size + Codec::frame_bytes(count)), copy_gbps(size),
                    [&](std::size_t i) {
                      const std::size_t k = i % 2;
                      lowbit::kernels::encode<Codec>(input<T>(k * size), count,
                                                     b.frames + k * fbytes, lowbit::rng_key{}, 0,
                                                     lowbit::feedback::none_ref{}, nullptr, pol);
                    });
        })
        ->UseManualTime()
        ->MinTime(0.1)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(
        ("policy_decode" + suffix).c_str(),
        [=](benchmark::State& st) {
          auto& b = bufs();
          for (std::size_t k = 0; k < 2; ++k)
            lowbit::kernels::encode<Codec>(input<T>(k * size), count, b.frames + k * fbytes,
                                           lowbit::rng_key{}, 0, lowbit::feedback::none_ref{},
                                           nullptr);
          run_timed(st, static_cast<double>(size + Codec::frame_bytes(count)), copy_gbps(size),
                    [&](std::size_t i) {
                      const std::size_t k = i % 2;
                      lowbit::kernels::decode<decoder>(
                          b.frames + k * fbytes, count,
                          reinterpret_cast<T*>(static_cast<char*>(b.out) + k * size), 1.0f, nullptr,
                          pol);
                    });
        })
        ->UseManualTime()
        ->MinTime(0.1)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(
        ("policy_dae_p2" + suffix).c_str(),
        [=](benchmark::State& st) {
          auto& b = bufs();
          for (int p = 0; p < 3; ++p)
            lowbit::kernels::encode<Codec>(input<T>(0), count, b.frames + p * fbytes,
                                           lowbit::rng_key{0, 0, static_cast<std::uint32_t>(p), 0},
                                           0, lowbit::feedback::none_ref{}, nullptr);
          run_timed(st, 3.0 * static_cast<double>(Codec::frame_bytes(count)), copy_gbps(size),
                    [&](std::size_t i) {
                      lowbit::kernels::decode_accumulate_encode<Codec>(
                          b.frames, fbytes, 2, count, b.frames + 3 * fbytes,
                          lowbit::rng_key{2, static_cast<std::uint32_t>(i), 0, 1}, 0,
                          lowbit::feedback::none_ref{}, static_cast<T*>(nullptr), 1.0f, nullptr,
                          pol);
                    });
        })
        ->UseManualTime()
        ->MinTime(0.1)
        ->Unit(benchmark::kMicrosecond);
  }
}

/// Issue 33's target for a row: the least ratio to the copy, or a negative number for a row
/// without one. Targets hold from 64 MiB up (smaller sizes are launch- and tail-bound).
///   encode, nearest, fp32/bf16, 4 and 8 bits        >= 0.95
///   encode, stochastic (encode_sr), 4 bits          >= 0.90
///   decode (plain, _slot and _hdr: the header check) >= 0.92
///   decode-accumulate-encode P = 2 (frame bytes)    >= 0.60 at 4 bits, 0.75 at 8
///   header check cost: hdr_cost_* (_hdr over _slot)  >= 0.99 (a cost <= 1%)
///   fused reduce reduce_pP (the decode kernel summing P frames;
///   held to the decode's bar less the check's 1% and a point, until measured) >= 0.90
double target_of(const row& r) {
  if (r.size < 64 * MiB) return -1.0;
  const auto is = [&](const char* prefix) { return r.op.rfind(prefix, 0) == 0; };
  if (r.op == "encode") return r.bits == 4 || r.bits == 8 ? 0.95 : -1.0;
  if (r.op == "encode_sr") return r.bits == 4 ? 0.90 : -1.0;
  if (is("hdr_cost")) return 0.99;
  if (is("decode")) return 0.92;
  if (is("dae_p2")) return r.bits == 4 ? 0.60 : r.bits == 8 ? 0.75 : -1.0;
  if (is("reduce_p")) return 0.90;
  return -1.0;
}

const char* verdict(const row& r) {
  const double t = target_of(r);
  if (t < 0) return "";
  return r.ratio >= t ? "met" : "MISSED";
}

/// hdr_cost_decode and hdr_cost_dae_p2 rows: the _hdr row's GB/s over the _slot row's.
void add_header_cost_rows() {
  std::vector<row> extra;
  for (const row& h : rows().rows) {
    const auto at = h.op.find("_hdr");
    if (at == std::string::npos) continue;
    const std::string base = h.op.substr(0, at);
    for (const row& sl : rows().rows)
      if (sl.op == base + "_slot" && sl.type == h.type && sl.bits == h.bits && sl.size == h.size &&
          sl.gbps > 0)
        extra.push_back(
            {"hdr_cost_" + base, h.type, h.bits, h.size, h.gbps, sl.gbps, h.gbps / sl.gbps});
  }
  for (const row& r : extra) rows().push_back(r);
}

/// Removes `--name=value` from argv and returns value ("" when absent).
std::string take_flag(int& argc, char** argv, const char* name) {
  const std::string prefix = std::string("--") + name + "=";
  std::string value;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      value = argv[i] + prefix.size();
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  return value;
}

void write_csv(const std::string& path, const std::string& commit) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "codec_bench: cannot write %s\n", path.c_str());
    return;
  }
  char date[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  std::fprintf(f, "op,type,bits,size_bytes,GB/s,copy_GB/s,ratio,target,date,commit\n");
  for (const row& r : rows().rows) {
    const double t = target_of(r);
    char target[16] = "";
    if (t >= 0) std::snprintf(target, sizeof target, "%.2f", t);
    std::fprintf(f, "%s,%s,%d,%zu,%.1f,%.1f,%.3f,%s,%s,%s\n", r.op.c_str(), r.type.c_str(), r.bits,
                 r.size, r.gbps, r.copy, r.ratio, target, date, commit.c_str());
  }
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string csv_path = take_flag(argc, argv, "summary_csv");
  std::string commit = take_flag(argc, argv, "commit");
  if (commit.empty()) commit = std::getenv("LOWBIT_COMMIT") ? std::getenv("LOWBIT_COMMIT") : "";
  if (commit.empty()) commit = "unknown";
  auto& b = bufs();
  BENCH_CUDA(cudaMalloc(&b.in, max_bytes));
  BENCH_CUDA(cudaMalloc(&b.out, max_bytes));
  // 8-bit frames of 1 GiB of fp32: about 0.27 GB each; room for a set of three, twice.
  b.frames_bytes = 6 * lowbit::align16(absmax_nearest<8>::frame_bytes(max_bytes / 4)) + 4 * MiB;
  BENCH_CUDA(cudaMalloc(&b.frames, b.frames_bytes));
  BENCH_CUDA(cudaEventCreate(&b.start));
  BENCH_CUDA(cudaEventCreate(&b.stop));
  fill<float><<<2048, 256>>>(static_cast<float*>(b.in), max_bytes / 4, 12345u);
  BENCH_CUDA(cudaGetLastError());
  BENCH_CUDA(cudaDeviceSynchronize());
  BENCH_CUDA(cudaMalloc(&b.in_bf16, max_bytes));
  fill<__nv_bfloat16><<<2048, 256>>>(static_cast<__nv_bfloat16*>(b.in_bf16), max_bytes / 2, 777u);
  BENCH_CUDA(cudaGetLastError());
  BENCH_CUDA(cudaDeviceSynchronize());

  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  benchmark::AddCustomContext("device", prop.name);
  benchmark::AddCustomContext("sms", std::to_string(prop.multiProcessorCount));

  for (std::size_t size = MiB; size <= max_bytes; size *= 4) {
    benchmark::RegisterBenchmark(
        ("copy/" + std::to_string(size / MiB) + "MiB").c_str(),
        [size](benchmark::State& st) {
          auto& bb = bufs();
          const std::size_t r = regions(size, max_bytes);
          run_timed(st, 2.0 * static_cast<double>(size), copy_gbps(size), [&](std::size_t i) {
            const std::size_t k = i % r;
            cudaMemcpyAsync(static_cast<char*>(bb.out) + k * size,
                            static_cast<const char*>(bb.in) + k * size, size,
                            cudaMemcpyDeviceToDevice);
          });
        })
        ->UseManualTime()
        ->MinTime(0.1)
        ->Unit(benchmark::kMicrosecond);
    // Not a row of the summary (no target): the log's ratio says how near a copy a pass
    // that only writes can come on this card.
    benchmark::RegisterBenchmark(
        ("write/" + std::to_string(size / MiB) + "MiB").c_str(),
        [size](benchmark::State& st) {
          auto& bb = bufs();
          const std::size_t r = regions(size, max_bytes);
          int sms = 0;
          BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
          const std::size_t n = size / sizeof(float4);
          const unsigned grid =
              static_cast<unsigned>(std::min<std::size_t>(std::size_t(sms) * 32, (n + 255) / 256));
          run_timed(st, static_cast<double>(size), copy_gbps(size), [&](std::size_t i) {
            float4* o = reinterpret_cast<float4*>(static_cast<char*>(bb.out) + (i % r) * size);
            write_only<<<grid, 256>>>(o, n);
          });
        })
        ->UseManualTime()
        ->MinTime(0.1)
        ->Unit(benchmark::kMicrosecond);
    register_type<float>("fp32", size);
    register_type<__nv_bfloat16>("bf16", size);
  }

  register_policy_sweep<absmax_nearest<4>, float>("fp32", 256 * MiB);
  register_policy_sweep<absmax_nearest<4>, __nv_bfloat16>("bf16", 256 * MiB);

  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  add_header_cost_rows();
  std::printf("\n%-15s %-5s %4s %9s %10s %10s %7s %6s %s\n", "op", "type", "bits", "size", "GB/s",
              "copy GB/s", "ratio", "target", "(>=64MiB)");
  for (const row& r : rows().rows) {
    const double t = target_of(r);
    char target[16] = "";
    if (t >= 0) std::snprintf(target, sizeof target, "%.2f", t);
    std::printf("%-15s %-5s %4d %6zuMiB %10.1f %10.1f %7.3f %6s %s\n", r.op.c_str(), r.type.c_str(),
                r.bits, r.size / MiB, r.gbps, r.copy, r.ratio, target, verdict(r));
  }
  if (!csv_path.empty()) write_csv(csv_path, commit);
  cudaFree(b.in);
  cudaFree(b.in_bf16);
  cudaFree(b.out);
  cudaFree(b.frames);
  return 0;
}
