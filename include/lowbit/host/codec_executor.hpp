// The codec over whole host buffers: encode, decode and decode-accumulate. It is the
// reference the CUDA kernels must match byte for byte, and the engine of the MPI backend.
//
// Speed without new bits: the loops run over whole blocks (statistics, quantize) and
// groups of 32 (pack, unpack, dequantize) as straight-line code over arrays, which the
// compiler vectorizes. The absmax quantizer's common path (a normal step, nearest or
// stochastic rounding) has a branch-free form here, equal bit for bit to
// quant::absmax::quantize (the executor tests compare them on every class of input);
// every other case calls the codec's functions unchanged. Large buffers are split into
// ranges of blocks, one std::thread each, joined before the call returns: every block
// and group is coded by itself, so the bytes do not depend on the split.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

#include "lowbit/codec/codec.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/numeric.hpp"
#include "lowbit/core/span.hpp"
#include "lowbit/feedback/refs.hpp"

namespace lowbit::host {

/// How a call may use the host's cores. `threads`: 0 picks the CPUs this process may run
/// on (its affinity mask: a rank that mpirun binds to one core stays on it), 1 keeps the
/// call on the calling thread. Buffers under `min_parallel` values always run on the
/// calling thread, and a thread gets at least min_parallel / 2 values.
struct exec_policy {
  int threads = 0;
  std::size_t min_parallel = std::size_t{1} << 20;
};

namespace detail {

template <class Codec>
void check_frame(const void* frame, std::size_t frame_size, std::size_t count, const char* what) {
  LOWBIT_EXPECTS(count == 0 || frame != nullptr, std::string(what) + ": frame is null");
  LOWBIT_EXPECTS(reinterpret_cast<std::uintptr_t>(frame) % 16 == 0,
                 std::string(what) + ": frame must be 16-byte aligned");
  LOWBIT_EXPECTS(frame_size >= Codec::frame_bytes(count),
                 std::string(what) + ": frame is too small: " + std::to_string(frame_size) +
                     " bytes for " + std::to_string(count) + " values, need " +
                     std::to_string(Codec::frame_bytes(count)));
}

// ---- threads --------------------------------------------------------------------------

/// The CPUs this process may run on.
inline int usable_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

/// How many threads code `count` values under `policy`.
inline int worker_count(std::size_t count, const exec_policy& policy) {
  if (policy.threads == 1 || count < policy.min_parallel || count == 0) return 1;
  const std::size_t most = count / (policy.min_parallel / 2 > 0 ? policy.min_parallel / 2 : 1);
  std::size_t n = static_cast<std::size_t>(policy.threads > 0 ? policy.threads : usable_cpus());
  if (n > most) n = most;
  return n > 1 ? static_cast<int>(n) : 1;
}

/// Runs f(first, last) over [0, units) split into `workers` contiguous ranges, the first
/// on the calling thread; every thread is joined before it returns. Should a thread fail
/// to start, its range runs on the calling thread. f must not throw.
template <class F>
void parallel_ranges(std::size_t units, int workers, const F& f) {
  if (workers <= 1 || units < 2) {
    f(std::size_t{0}, units);
    return;
  }
  const auto w =
      static_cast<std::size_t>(workers) < units ? static_cast<std::size_t>(workers) : units;
  auto bound = [&](std::size_t k) { return units / w * k + (k < units % w ? k : units % w); };
  std::vector<std::thread> pool;
  pool.reserve(w - 1);
  std::size_t inline_from = w;  // ranges [inline_from, w) run here if a thread fails
  for (std::size_t k = 1; k < w; ++k) {
    try {
      pool.emplace_back([&f, first = bound(k), last = bound(k + 1)] { f(first, last); });
    } catch (...) {
      inline_from = k;
      break;
    }
  }
  f(bound(0), bound(1));
  for (std::size_t k = inline_from; k < w; ++k) f(bound(k), bound(k + 1));
  for (std::thread& t : pool) t.join();
}

// ---- block statistics -----------------------------------------------------------------

/// quant::block_stats of c[0, n) (1 <= n <= B), equal to adding them one by one in
/// order; c[n, B) holds copies of c[0] (which change neither min nor max). A block with
/// inf or nan (rare) is added one by one. Otherwise min and max are taken by halving;
/// they are exact, so the result is the sequential one up to the sign of a zero: a zero
/// result takes the sign of the block's first zero, which is what the sequential
/// comparisons (strict, so ties keep the earlier value) leave.
template <int B>
quant::block_stats block_stats_of(const float* c, int n) {
  static_assert(B % 32 == 0, "lowbit::host: blocks are multiples of 32 values");
  constexpr int H = B / 2;
  float lo[H], hi[H];
  std::uint32_t nonfinite = 0;
  for (int j = 0; j < H; ++j) {
    std::uint32_t u, v;
    std::memcpy(&u, &c[j], sizeof u);
    std::memcpy(&v, &c[j + H], sizeof v);
    nonfinite |=
        ((u & 0x7f800000u) == 0x7f800000u ? 1u : 0u) | ((v & 0x7f800000u) == 0x7f800000u ? 1u : 0u);
    lo[j] = lowbit::detail::min_f(c[j], c[j + H]);
    hi[j] = lowbit::detail::max_f(c[j], c[j + H]);
  }
  quant::block_stats s;
  if (nonfinite) {
    for (int i = 0; i < n; ++i) s.add(c[i]);
    return s;
  }
  // Halve while the live width is even (B / 2 need not be a power of two: 48 for blocks
  // of 96, 80 for 160), then fold what is left, so every partial extreme is taken.
  int m = H;
  while (m % 2 == 0 && m > 4) {
    const int w = m / 2;
    for (int j = 0; j < w; ++j) {
      lo[j] = lowbit::detail::min_f(lo[j], lo[j + w]);
      hi[j] = lowbit::detail::max_f(hi[j], hi[j + w]);
    }
    m = w;
  }
  for (int j = 0; j < m; ++j) {
    s.min = lowbit::detail::min_f(s.min, lo[j]);
    s.max = lowbit::detail::max_f(s.max, hi[j]);
  }
  if (s.min == 0.0f || s.max == 0.0f) {
    for (int i = 0; i < n; ++i) {
      if (c[i] == 0.0f) {
        if (s.min == 0.0f) s.min = c[i];
        if (s.max == 0.0f) s.max = c[i];
        break;
      }
    }
  }
  return s;
}

// ---- the absmax fast path -------------------------------------------------------------

template <class Q>
struct is_absmax : std::false_type {};
template <int Bits, int Block, class Grid>
struct is_absmax<quant::absmax<Bits, Block, Grid>> : std::true_type {};

/// True when the codec's quantize has the branch-free block form below.
template <class Codec>
inline constexpr bool has_fast_quantize_v =
    is_absmax<typename Codec::quantizer_type>::value &&
    (std::is_same_v<typename Codec::rounding_type, round::nearest> ||
     std::is_same_v<typename Codec::rounding_type, round::stochastic>);

/// The 16-bit noise of elements [16 * j0, 16 * (j0 + N)): noise[16k + m] is what
/// codec::quantize_group takes from key.draw(j0 + k) for element m (rng_key::noise16).
/// philox4x32<10>'s rounds, the same operations in the same order, on two counters at a time: the
/// two chains of multiplies overlap, and both states stay in registers.
template <int N>
void noise_of(const rng_key& key, std::uint64_t j0, std::uint32_t (&noise)[16 * N]) {
  static_assert(N % 2 == 0, "lowbit::host: noise comes in pairs of Philox blocks");
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  auto round = [](philox_block& c, std::uint32_t k0, std::uint32_t k1) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(m0) * c.w[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(m1) * c.w[2];
    c = philox_block{
        {static_cast<std::uint32_t>(p1 >> 32) ^ c.w[1] ^ k0, static_cast<std::uint32_t>(p1),
         static_cast<std::uint32_t>(p0 >> 32) ^ c.w[3] ^ k1, static_cast<std::uint32_t>(p0)}};
  };
  auto counter = [&](std::uint64_t j) {
    return philox_block{{static_cast<std::uint32_t>(j),
                         static_cast<std::uint32_t>(j >> 32) ^ (key.stage << 24), key.step,
                         key.rank}};
  };
  auto spread = [&](const philox_block& r, int k) {
    for (int m = 0; m < 16; ++m) noise[16 * k + m] = rng_key::noise16(r, m);
  };
  for (int k = 0; k < N; k += 2) {
    philox_block a = counter(j0 + static_cast<std::uint64_t>(k));
    philox_block b = counter(j0 + static_cast<std::uint64_t>(k) + 1);
    std::uint32_t k0 = static_cast<std::uint32_t>(key.seed);
    std::uint32_t k1 = static_cast<std::uint32_t>(key.seed >> 32);
    for (int r = 0; r < 10; ++r) {
      round(a, k0, k1);
      round(b, k0, k1);
      k0 += w0;
      k1 += w1;
    }
    spread(a, k);
    spread(b, k + 1);
  }
}

/// t[i] = c[i] * inv rounded towards zero, as lowbit::detail::fmul_rz: the product is
/// exact in a double, and its nearest float steps one float towards zero (its bits minus
/// one) when it went past. The step is carried as the float 1 or 0 (bits 0x3f800000 or
/// 0: shifted right by 29, 1 or 0), which keeps both loops vectorizable.
template <int B>
void mul_rz(const float* c, float inv, float (&t)[B]) {
  float past[B];
  for (int i = 0; i < B; ++i) {
    const double d = static_cast<double>(c[i]) * static_cast<double>(inv);
    t[i] = static_cast<float>(d);
    past[i] = static_cast<float>(std::fabs(static_cast<double>(t[i])) > std::fabs(d) ? 1.0 : 0.0);
  }
  for (int i = 0; i < B; ++i) {
    std::uint32_t u, p;
    std::memcpy(&u, &t[i], sizeof u);
    std::memcpy(&p, &past[i], sizeof p);
    u -= p >> 29;
    std::memcpy(&t[i], &u, sizeof u);
  }
}

/// Codes of c[0, B) in a block whose params take the scaled path (!p.divide), equal to
/// Q::quantize<Rounding>(c[i], p, noise[i]): x scaled towards zero by inv_step, then
///  nearest:    (t + shift) + round_magic, whose low bits hold the rounded integer;
///  stochastic: c = ceil(2^16 t) + 2^16 (shift - Lo), in 32 bits (in range by
///              construction, as the quantizer's scaling guarantees), and
///              (c + 0xffff - noise) >> 16.
template <class Q, class Rounding, int B>
void quantize_scaled(const float* c, const typename Q::params_type& p, const std::uint32_t* noise,
                     std::uint32_t (&codes)[B]) {
  constexpr int Lo = Q::qmin;
  constexpr float shift = Q::zero_grid ? 0.0f : -0.5f;
  constexpr auto offset = static_cast<std::uint32_t>(Q::qmin + Q::half_levels);
  float pos[B];
  mul_rz<B>(c, p.inv_step, pos);
  if constexpr (std::is_same_v<Rounding, round::nearest>) {
    constexpr std::uint32_t sub = lowbit::detail::round_magic_bits + static_cast<std::uint32_t>(Lo);
    for (int i = 0; i < B; ++i) {
      float t = pos[i];
      if constexpr (shift != 0.0f) t = t + shift;
      const float s = t + lowbit::detail::round_magic;
      std::uint32_t sb;
      std::memcpy(&sb, &s, sizeof sb);
      codes[i] = sb - sub + offset;
    }
  } else {
    // 2^16 (shift - Lo): an integer below 2^31.
    constexpr auto base = static_cast<std::uint32_t>(
        static_cast<std::int64_t>((shift - static_cast<float>(Lo)) * 65536.0f));
    for (int i = 0; i < B; ++i) {
      const float y = pos[i] * 65536.0f;  // exact, |y| < 2^31
      const auto tr = static_cast<std::int32_t>(y);
      const std::int32_t up = static_cast<float>(tr) < y ? 1 : 0;  // ceil = trunc + (trunc < y)
      const std::uint32_t cc = static_cast<std::uint32_t>(tr + up) + base;
      codes[i] = ((cc + (0xffffu - noise[i])) >> 16) + offset;
    }
  }
}

// ---- encode and decode over ranges ----------------------------------------------------

/// Encodes blocks [b0, b1) of x (count values) into the frame.
template <class Codec, class T, class Feedback>
void encode_blocks(const T* x, std::size_t count, std::byte* frame, const rng_key& key,
                   std::uint64_t index0, Feedback fb, std::size_t b0, std::size_t b1) {
  using Q = typename Codec::quantizer_type;
  using R = typename Codec::rounding_type;
  constexpr int B = Codec::block_size, G = Codec::group_size;
  std::byte* codes_base = frame + Codec::codes_offset(count);
  for (std::size_t block = b0; block < b1; ++block) {
    const std::size_t first = block * B;
    const int n = static_cast<int>(count - first < B ? count - first : B);
    // The block's values c[0, n) padded to B with c[0]: in place for a whole block of
    // floats without feedback, else in cbuf.
    float cbuf[B];
    const float* c = cbuf;
    if constexpr (std::is_same_v<T, float> && !Feedback::active) {
      if (n == B) {
        c = x + first;
      } else {
        for (int i = 0; i < n; ++i) cbuf[i] = x[first + i];
      }
    } else {
      for (int i = 0; i < n; ++i) cbuf[i] = fb.load(first + i, to_float(x[first + i]));
    }
    for (int i = n; i < B; ++i) cbuf[i] = cbuf[0];
    const quant::block_stats stats = block_stats_of<B>(c, n);
    const auto meta = Q::make_meta(stats);
    const auto params = Q::make_params(meta);
    std::memcpy(frame + block * sizeof meta, &meta, sizeof meta);

    std::uint32_t codes[B];
    bool fast = false;
    if constexpr (has_fast_quantize_v<Codec>) {
      if (!params.divide) {
        fast = true;
        if constexpr (R::needs_noise) {
          std::uint32_t noise[B];
          noise_of<B / 16>(key, (index0 + first) / 16, noise);
          quantize_scaled<Q, R, B>(c, params, noise, codes);
        } else {
          static_assert(std::is_same_v<R, round::nearest>, "only nearest rounding takes no noise");
          quantize_scaled<Q, R, B>(c, params, nullptr, codes);
        }
        for (int i = 0; i < B; ++i) codes[i] = i < n ? codes[i] : 0u;
      }
    }
    if (!fast) {
      for (int g = 0; g < Codec::groups_per_block; ++g) {
        float xs[G] = {};
        const int valid = n - g * G < 0 ? 0 : (n - g * G < G ? n - g * G : G);
        for (int i = 0; i < valid; ++i) xs[i] = c[g * G + i];
        std::uint32_t gc[G];
        Codec::quantize_group(xs, valid, params, key, index0 + first + g * G, gc);
        std::memcpy(codes + g * G, gc, sizeof gc);
      }
    }
    for (int g = 0; g < Codec::groups_per_block; ++g) {
      std::uint32_t gc[G], words[Codec::bits];
      std::memcpy(gc, codes + g * G, sizeof gc);
      Codec::pack(gc, words);
      std::memcpy(codes_base + (block * Codec::groups_per_block + g) * Codec::group_bytes, words,
                  sizeof words);
    }
    if (Feedback::active && !stats.poisoned()) {
      for (int i = 0; i < n; ++i) fb.store(first + i, c[i], Q::dequantize(codes[i], meta));
    }
  }
}

/// Makes the compiler forget what it knows of the floats at p: they are read back from
/// memory afterwards. A product stored there is then never fused with a later add (the
/// contraction that lowbit::detail::pin prevents one value at a time), while the loops on
/// either side stay vectorizable.
inline void forget(float* p) {
#if defined(__GNUC__)
  asm volatile("" : : "r"(p) : "memory");
#else
  (void)p;  // other compilers do not contract across statements by default
#endif
}

/// Codec::dequantize_group, bit for bit. For absmax a vectorizable loop: the code's
/// level q (exact: float_of) and q + 1/2 (exact) times the step, one rounding, as
/// quant::absmax::dequantize. Then forget(y) (every quantizer), so that no caller fuses
/// a product into its sum.
template <class Codec>
void dequantize_group(const std::uint32_t (&codes)[Codec::group_size],
                      const typename Codec::meta_type& meta, float (&y)[Codec::group_size]) {
  using Q = typename Codec::quantizer_type;
  if constexpr (is_absmax<Q>::value) {
    constexpr std::uint32_t base =
        lowbit::detail::round_magic_bits - static_cast<std::uint32_t>(Q::half_levels);
    const float step = meta.step;
    for (int i = 0; i < Codec::group_size; ++i) {
      const std::uint32_t u = base + codes[i];
      float q;
      std::memcpy(&q, &u, sizeof q);
      q = q - lowbit::detail::round_magic;
      if constexpr (!Q::zero_grid) q = q + 0.5f;
      y[i] = q * step;
    }
    forget(y);
  } else {
    Codec::dequantize_group(codes, meta, y);
    forget(y);
  }
}

/// Decodes groups [g0, g1) of a frame of `count` values, calling sink(first, y, valid)
/// with each group's first index, its 32 decoded values and how many are real.
template <class Codec, class Sink>
void for_each_group(const std::byte* frame, std::size_t count, std::size_t g0, std::size_t g1,
                    Sink&& sink) {
  constexpr int G = Codec::group_size;
  const std::byte* codes_base = frame + Codec::codes_offset(count);
  for (std::size_t group = g0; group < g1; ++group) {
    std::uint32_t words[Codec::bits], codes[G];
    std::memcpy(words, codes_base + group * Codec::group_bytes, sizeof words);
    Codec::unpack(words, codes);
    typename Codec::meta_type meta;
    std::memcpy(&meta, frame + group / Codec::groups_per_block * sizeof meta, sizeof meta);
    float y[G];
    dequantize_group<Codec>(codes, meta, y);
    const std::size_t first = group * G;
    sink(first, y, static_cast<int>(count - first < G ? count - first : G));
  }
}

/// Groups covering `count` values.
template <class Codec>
constexpr std::size_t num_groups(std::size_t count) {
  return (count + Codec::group_size - 1) / Codec::group_size;
}

}  // namespace detail

/// Encodes x into `frame` (Codec::frame_bytes(x.size()) bytes, 16-byte aligned).
///
/// `index0` is the tensor index of x[0] (a multiple of 32): it keys stochastic rounding
/// so that a shard encodes as it would inside the whole tensor. `fb` is an error-feedback
/// ref (lowbit/feedback/refs.hpp) indexed from x[0]; a block holding inf/nan leaves the
/// feedback state untouched (the step will be skipped by the loss scaler: its error is
/// not real) and decodes to nan. The bytes do not depend on `policy`.
template <class Codec, class T, class Feedback = feedback::none_ref>
void encode(span<const T> x, span<std::byte> frame, const rng_key& key = {},
            std::uint64_t index0 = 0, Feedback fb = {}, const exec_policy& policy = {}) {
  static_assert(is_codec_v<Codec>, "lowbit::host::encode: Codec must be a lowbit::codec<...>");
  static_assert(is_element_type_v<T>,
                "lowbit::host::encode: the element type must be float, __half or __nv_bfloat16");
  static_assert(feedback::is_feedback_ref_v<Feedback>,
                "lowbit::host::encode: fb must be a feedback ref (lowbit/feedback/refs.hpp)");
  const std::size_t count = x.size();
  LOWBIT_EXPECTS(count == 0 || x.data() != nullptr, "encode: x is null but count is nonzero");
  detail::check_frame<Codec>(frame.data(), frame.size(), count, "encode");
  LOWBIT_EXPECTS(index0 % Codec::group_size == 0, "encode: index0 must be a multiple of 32");
  using E = std::remove_cv_t<T>;
  const E* xp = x.data();
  std::byte* fp = frame.data();
  // The meta section's padding is zero, as the kernels write it: every byte is defined.
  const std::size_t meta_end = Codec::num_blocks(count) * sizeof(typename Codec::meta_type);
  if (count > 0) std::memset(fp + meta_end, 0, Codec::codes_offset(count) - meta_end);
  detail::parallel_ranges(Codec::num_blocks(count), detail::worker_count(count, policy),
                          [&](std::size_t b0, std::size_t b1) {
                            detail::encode_blocks<Codec, E, Feedback>(xp, count, fp, key, index0,
                                                                      fb, b0, b1);
                          });
}

/// Decodes a frame of `out.size()` values into out, multiplied by `scale` (1/P for avg).
template <class Codec, class T>
void decode(span<const std::byte> frame, span<T> out, float scale = 1.0f,
            const exec_policy& policy = {}) {
  static_assert(is_codec_v<Codec>, "lowbit::host::decode: Codec must be a lowbit::codec<...>");
  static_assert(is_element_type_v<T>,
                "lowbit::host::decode: the element type must be float, __half or __nv_bfloat16");
  const std::size_t count = out.size();
  LOWBIT_EXPECTS(count == 0 || out.data() != nullptr, "decode: out is null but count is nonzero");
  detail::check_frame<Codec>(frame.data(), frame.size(), count, "decode");
  const std::byte* fp = frame.data();
  T* op = out.data();
  detail::parallel_ranges(detail::num_groups<Codec>(count), detail::worker_count(count, policy),
                          [&](std::size_t g0, std::size_t g1) {
                            detail::for_each_group<Codec>(
                                fp, count, g0, g1,
                                [&](std::size_t first, const float* y, int valid) {
                                  if (scale != 1.0f) {
                                    for (int i = 0; i < valid; ++i)
                                      op[first + i] = from_float<T>(y[i] * scale);
                                  } else {
                                    for (int i = 0; i < valid; ++i)
                                      op[first + i] = from_float<T>(y[i]);
                                  }
                                });
                          });
}

/// acc[i] += decoded value i, in fp32: the reduction step of all_reduce.
template <class Codec>
void decode_accumulate(span<const std::byte> frame, span<float> acc,
                       const exec_policy& policy = {}) {
  static_assert(is_codec_v<Codec>,
                "lowbit::host::decode_accumulate: Codec must be a lowbit::codec<...>");
  const std::size_t count = acc.size();
  LOWBIT_EXPECTS(count == 0 || acc.data() != nullptr,
                 "decode_accumulate: acc is null but count is nonzero");
  detail::check_frame<Codec>(frame.data(), frame.size(), count, "decode_accumulate");
  const std::byte* fp = frame.data();
  float* ap = acc.data();
  detail::parallel_ranges(detail::num_groups<Codec>(count), detail::worker_count(count, policy),
                          [&](std::size_t g0, std::size_t g1) {
                            detail::for_each_group<Codec>(
                                fp, count, g0, g1,
                                [&](std::size_t first, const float* y, int valid) {
                                  for (int i = 0; i < valid; ++i)
                                    ap[first + i] = ap[first + i] + y[i];
                                });
                          });
}

/// acc = the sum of `num_frames` frames of `acc.size()` values (frame p at
/// frames + p * frame_stride), in fp32, in order p = 0, 1, ...: exactly acc = 0 followed
/// by decode_accumulate of each frame in turn. When `out` is not null, out[i] = acc[i]
/// times `scale` (1/P for avg) as well. Each thread sums its own range of groups over
/// every frame.
template <class Codec, class U = float>
void sum_frames(const std::byte* frames, std::size_t frame_stride, int num_frames, span<float> acc,
                U* out = nullptr, float scale = 1.0f, const exec_policy& policy = {}) {
  static_assert(is_codec_v<Codec>, "lowbit::host::sum_frames: Codec must be a lowbit::codec<...>");
  static_assert(
      is_element_type_v<U>,
      "lowbit::host::sum_frames: the element type must be float, __half or __nv_bfloat16");
  const std::size_t count = acc.size();
  LOWBIT_EXPECTS(num_frames >= 1, "sum_frames: num_frames must be >= 1");
  LOWBIT_EXPECTS(count == 0 || acc.data() != nullptr,
                 "sum_frames: acc is null but count is nonzero");
  LOWBIT_EXPECTS(frame_stride >= Codec::frame_bytes(count) && frame_stride % 16 == 0,
                 "sum_frames: frame_stride must hold a frame and be a multiple of 16");
  for (int p = 0; p < num_frames; ++p)
    detail::check_frame<Codec>(frames + p * frame_stride, frame_stride, count, "sum_frames");
  float* ap = acc.data();
  detail::parallel_ranges(
      detail::num_groups<Codec>(count), detail::worker_count(count, policy),
      [&](std::size_t g0, std::size_t g1) {
        const std::size_t lo = g0 * Codec::group_size;
        const std::size_t hi = g1 * Codec::group_size < count ? g1 * Codec::group_size : count;
        for (std::size_t i = lo; i < hi; ++i) ap[i] = 0.0f;
        for (int p = 0; p < num_frames; ++p)
          detail::for_each_group<Codec>(frames + p * frame_stride, count, g0, g1,
                                        [&](std::size_t first, const float* y, int valid) {
                                          for (int i = 0; i < valid; ++i)
                                            ap[first + i] = ap[first + i] + y[i];
                                        });
        if (out == nullptr) return;
        if (scale != 1.0f) {
          for (std::size_t i = lo; i < hi; ++i) out[i] = from_float<U>(ap[i] * scale);
        } else {
          for (std::size_t i = lo; i < hi; ++i) out[i] = from_float<U>(ap[i]);
        }
      });
}

/// The middle of all_reduce: sums `num_frames` frames of one shard (frame p at
/// frames + p * frame_stride) in fp32, in order p = 0, 1, ..., then encodes the sum into
/// `out_frame` with feedback `fb` (a second-stage residual, or none). `acc` is scratch of
/// `count` floats and holds the exact fp32 sum afterwards.
template <class Codec, class Feedback = feedback::none_ref>
void decode_accumulate_encode(const std::byte* frames, std::size_t frame_stride, int num_frames,
                              span<float> acc, span<std::byte> out_frame, const rng_key& key = {},
                              std::uint64_t index0 = 0, Feedback fb = {},
                              const exec_policy& policy = {}) {
  const std::size_t count = acc.size();
  LOWBIT_EXPECTS(num_frames >= 1, "decode_accumulate_encode: num_frames must be >= 1");
  LOWBIT_EXPECTS(
      frame_stride >= Codec::frame_bytes(count) && frame_stride % 16 == 0,
      "decode_accumulate_encode: frame_stride must hold a frame and be a multiple of 16");
  sum_frames<Codec>(frames, frame_stride, num_frames, acc, static_cast<float*>(nullptr), 1.0f,
                    policy);
  encode<Codec>(span<const float>(acc.data(), count), out_frame, key, index0, fb, policy);
}

}  // namespace lowbit::host
