// Helpers shared by the collective tests of both backends: seeded inputs that every
// rank can regenerate for every other rank, fp64 references, error bounds derived
// from the codec's step, and a single-process simulation of the flat all-reduce built
// from the host executor (the "host simulation" bitscom's tests compare against).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "lowbit/codec/codec.hpp"
#include "lowbit/collective/detail/host_buffer.hpp"
#include "lowbit/collective/types.hpp"
#include "lowbit/core/numeric.hpp"
#include "lowbit/host/codec_executor.hpp"
#include "lowbit/schedule/schedule.hpp"
#include "test_random.hpp"

namespace lowbit::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

/// The run's seed, rank 0's, the same on every rank.
inline std::uint64_t shared_seed() {
  static const std::uint64_t s = [] {
    std::uint64_t v = seed();
    MPI_Bcast(&v, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    return v;
  }();
  return s;
}

/// Input kinds; each rank's input is a function of (shared seed, kind, salt, rank).
enum class input_kind { normal, linspace, smooth, alternating, spikes, ones, constant_normal };

/// The input rank `rank` uses for (kind, count, salt): any rank can compute any rank's.
inline std::vector<float> make_input(input_kind kind, std::size_t count, int rank,
                                     std::uint64_t salt = 0) {
  std::mt19937_64 g(shared_seed() ^ (salt * 0x9e3779b97f4a7c15ull) ^
                    (static_cast<std::uint64_t>(rank + 1) * 0xbf58476d1ce4e5b9ull));
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> x(count);
  for (std::size_t i = 0; i < count; ++i) {
    switch (kind) {
      case input_kind::normal:
        x[i] = n01(g);
        break;
      case input_kind::constant_normal:
        x[i] = n01(g);
        break;
      case input_kind::linspace:  // linspace(-2.5, 3) + 0.037 * rank
        x[i] = static_cast<float>(-2.5 + 5.5 * (count > 1 ? double(i) / double(count - 1) : 0.0) +
                                  0.037 * rank);
        break;
      case input_kind::smooth:
        x[i] = static_cast<float>(std::sin(double(i) / 40.0) * (1.0 + 0.05 * rank) + 0.2);
        break;
      case input_kind::alternating:  // +-(1 + 0.1 * rank)
        x[i] = static_cast<float>((i % 2 ? -1.0 : 1.0) * (1.0 + 0.1 * rank));
        break;
      case input_kind::spikes:  // 1.5 * randn + 0.031 * rank, a spike every 17th element
        x[i] = i % 17 == 0 ? 25.0f + rank : 1.5f * n01(g) + 0.031f * rank;
        break;
      case input_kind::ones:
        x[i] = static_cast<float>(rank + 1);
        break;
    }
  }
  if (kind == input_kind::normal) {  // 1.5 * randn + 0.031 * rank, like bitscom's 2-bit case
    for (auto& v : x) v = 1.5f * v + 0.031f * rank;
  }
  return x;
}

template <class T>
std::vector<T> convert(const std::vector<float>& x) {
  std::vector<T> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = from_float<T>(x[i]);
  return y;
}
template <class T>
std::vector<double> to_double(const std::vector<T>& x) {
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = to_float(x[i]);
  return y;
}

/// The grid step Codec gives a block holding values of magnitude up to `amax`.
template <class Codec>
double step_for(double amax) {
  quant::block_stats s;
  s.add(static_cast<float>(-amax));
  s.add(static_cast<float>(amax));
  return Codec::quantizer_type::step(Codec::quantizer_type::make_meta(s));
}

/// Largest error of one encode in units of the step: 1/2 nearest, 1 stochastic.
template <class Codec>
constexpr double rounding_factor() {
  return Codec::rounding_type::needs_noise ? 1.0 : 0.5;
}

/// max |x| over each block of `block` values.
inline std::vector<double> block_absmax(const std::vector<double>& x, std::size_t block) {
  std::vector<double> a((x.size() + block - 1) / block, 0.0);
  for (std::size_t i = 0; i < x.size(); ++i) a[i / block] = std::max(a[i / block], std::abs(x[i]));
  return a;
}

/// Per-element error bound of the low-bit all_reduce (two quantizations) or of one
/// quantization (reduce_scatter / all_gather) over inputs `xs` of every rank.
template <class Codec>
std::vector<double> error_bound(const std::vector<std::vector<double>>& xs, bool two_stages,
                                double scale) {
  const std::size_t count = xs.empty() ? 0 : xs[0].size(), B = Codec::block_size;
  const double f = rounding_factor<Codec>();
  std::vector<double> e0((count + B - 1) / B, 0.0), sum(count, 0.0), bound(count);
  for (const auto& x : xs) {
    const auto a = block_absmax(x, B);
    for (std::size_t b = 0; b < a.size(); ++b) e0[b] += f * step_for<Codec>(a[b]);
    for (std::size_t i = 0; i < count; ++i) sum[i] += x[i];
  }
  const auto as = block_absmax(sum, B);
  double mag = 0;
  for (const auto& x : xs)
    for (double v : x) mag = std::max(mag, std::abs(v));
  const double slack = 4e-6 * mag * static_cast<double>(xs.size()) + 1e-30;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t b = i / B;
    double e = e0[b];
    if (two_stages) e += f * step_for<Codec>(as[b] + e0[b]);
    bound[i] = (e + slack) * scale;
  }
  return bound;
}

/// Relative rounding of the output type (0 for float).
template <class T>
constexpr double output_rounding() {
  if constexpr (std::is_same_v<T, float>) {
    return 0.0;
  } else if constexpr (std::is_same_v<T, __half>) {
    return 1.0 / 2048;
  } else {
    return 1.0 / 256;
  }
}

/// worst |out - exact| / bound over the elements (<= 1 passes). The output type rounds
/// the reduced value, exact + e with |e| <= bound, not exact: relative rounding r adds up
/// to r (|exact| + bound).
template <class T>
double worst_ratio(const std::vector<T>& out, const std::vector<double>& exact,
                   const std::vector<double>& bound) {
  double w = 0;
  const double r = output_rounding<T>();
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double y = to_float(out[i]);
    const double b = bound[i] * (1 + r) + r * std::abs(exact[i]);
    const double r = std::isfinite(y) ? std::abs(y - exact[i]) / b : 1e300;
    w = std::max(w, r);
  }
  return w;
}

/// True when `bytes` at p are the same on every rank (compared with rank 0's).
inline bool same_on_all_ranks(const void* p, std::size_t bytes) {
  std::vector<unsigned char> mine(bytes), root(bytes);
  if (bytes) std::memcpy(mine.data(), p, bytes);
  root = mine;
  MPI_Bcast(root.data(), static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD);
  int same = mine == root ? 1 : 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all != 0;
}

/// The flat low-bit all_reduce of `xs` (one input per rank) computed in one process,
/// by `algo` (one_shot or two_phase).
template <class Codec, class T>
std::vector<T> simulate_all_reduce(const std::vector<std::vector<T>>& xs, std::size_t count,
                                   std::uint64_t seed, std::uint32_t step, reduce_op op,
                                   all_reduce_algorithm algo) {
  const int P = static_cast<int>(xs.size());
  const float scale = op == reduce_op::avg ? 1.0f / static_cast<float>(P) : 1.0f;
  std::vector<T> out(count);
  if (algo == all_reduce_algorithm::one_shot) {  // every rank's whole frame, summed in order
    const std::size_t fb = Codec::frame_bytes(count);
    lowbit::detail::host_buffer<std::byte> frames(fb * P);
    std::vector<float> acc(count, 0.0f);
    for (int p = 0; p < P; ++p)
      host::encode<Codec>(span<const T>(xs[p].data(), count),
                          span<std::byte>(frames.data() + p * fb, fb),
                          rng_key{seed, step, static_cast<std::uint32_t>(p), 0}, 0);
    for (int p = 0; p < P; ++p)
      host::decode_accumulate<Codec>(span<const std::byte>(frames.data() + p * fb, fb),
                                     span<float>(acc.data(), count));
    for (std::size_t i = 0; i < count; ++i)
      out[i] = from_float<T>(scale != 1.0f ? acc[i] * scale : acc[i]);
    return out;
  }
  for (int q = 0; q < P; ++q) {
    const auto s = schedule::shard(count, Codec::block_size, P, q);
    if (s.count == 0) continue;
    const std::size_t fb = Codec::frame_bytes(s.count);
    lowbit::detail::host_buffer<std::byte> frames(fb * P), red(fb);
    lowbit::detail::host_buffer<float> acc(s.count);
    for (int p = 0; p < P; ++p)
      host::encode<Codec>(span<const T>(xs[p].data() + s.begin, s.count),
                          span<std::byte>(frames.data() + p * fb, fb),
                          rng_key{seed, step, static_cast<std::uint32_t>(p), 0}, s.begin);
    host::decode_accumulate_encode<Codec>(
        frames.data(), fb, P, span<float>(acc.data(), s.count), span<std::byte>(red.data(), fb),
        rng_key{seed, step, static_cast<std::uint32_t>(q), 1}, s.begin);
    host::decode<Codec>(span<const std::byte>(red.data(), fb),
                        span<T>(out.data() + s.begin, s.count), scale);
  }
  return out;
}

}  // namespace lowbit::test
