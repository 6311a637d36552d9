// Helpers for the host-vs-device tests of the codec kernels: device buffers, poisoned
// outputs, random inputs with awkward values, and the comparisons themselves.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "lowbit/host/codec_executor.hpp"
#include "lowbit/kernels/kernels.cuh"
#include "test_random.hpp"

namespace lowbit::test {

#define KT_CUDA(call)                                                                     \
  do {                                                                                    \
    cudaError_t kt_status_ = (call);                                                      \
    if (kt_status_ != cudaSuccess) FAIL(#call << ": " << cudaGetErrorString(kt_status_)); \
  } while (0)

/// Bytes poured into every output before a run: a value no kernel writes by accident.
inline constexpr int poison_byte = 0xA7;

/// Owning device memory, poisoned at construction.
template <class T>
struct device_array {
  explicit device_array(std::size_t n, std::size_t extra_bytes = 64) : size(n) {
    bytes = n * sizeof(T) + extra_bytes;
    KT_CUDA(cudaMalloc(&raw, bytes));
    poison();
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() { cudaFree(raw); }
  T* data() const { return static_cast<T*>(raw); }
  void poison() { KT_CUDA(cudaMemset(raw, poison_byte, bytes)); }
  void upload(const T* src, std::size_t n, std::size_t offset_bytes = 0) {
    KT_CUDA(cudaMemcpy(static_cast<char*>(raw) + offset_bytes, src, n * sizeof(T),
                       cudaMemcpyHostToDevice));
  }
  /// The first `bytes` bytes, whatever T is (to tell the poison from what a kernel wrote).
  std::vector<std::byte> download_bytes(std::size_t bytes) const {
    std::vector<std::byte> v(bytes);
    KT_CUDA(cudaMemcpy(v.data(), raw, bytes, cudaMemcpyDeviceToHost));
    return v;
  }
  std::vector<T> download(std::size_t n, std::size_t offset_bytes = 0) const {
    std::vector<T> v(n);
    KT_CUDA(cudaMemcpy(v.data(), static_cast<const char*>(raw) + offset_bytes, n * sizeof(T),
                       cudaMemcpyDeviceToHost));
    return v;
  }
  void* raw = nullptr;
  std::size_t size = 0;
  std::size_t bytes = 0;
};

/// A 16-byte aligned host byte buffer, poisoned like the device outputs.
struct host_frame {
  explicit host_frame(std::size_t n) : storage(n / 16 + 2) {
    std::memset(storage.data(), poison_byte, storage.size() * 16);
  }
  std::byte* data() { return reinterpret_cast<std::byte*>(storage.data()); }
  const std::byte* data() const { return reinterpret_cast<const std::byte*>(storage.data()); }
  std::size_t size() const { return storage.size() * 16; }
  span<std::byte> bytes() { return {data(), size()}; }
  span<const std::byte> cbytes() const { return {data(), size()}; }
  struct alignas(16) chunk {
    unsigned char b[16];
  };
  std::vector<chunk> storage;
};

/// The raw bits of a value, for exact comparison.
template <class T>
std::uint32_t bits_of(T v) {
  if constexpr (sizeof(T) == 4) {
    std::uint32_t u;
    std::memcpy(&u, &v, 4);
    return u;
  } else {
    std::uint16_t u;
    std::memcpy(&u, &v, 2);
    return u;
  }
}

template <class T>
std::vector<T> convert(const std::vector<float>& x) {
  std::vector<T> v(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) v[i] = from_float<T>(x[i]);
  return v;
}

/// What kind of values a test draws.
enum class values { normal, awkward };

/// Random inputs. `awkward` gives each 32-value stretch a character: normal data of a
/// random scale (1e-30 .. 1e30), subnormals, values near FLT_MAX, all zeros of mixed
/// sign, zero extremes (min or max exactly +-0), constant runs, inf/nan sprinkled in,
/// one-sided data. Every stretch is fresh each run (the seed is printed).
inline std::vector<float> make_values(std::size_t n, std::uint64_t salt, values kind) {
  auto g = rng(salt);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 11);
  std::uniform_real_distribution<float> expo(-30.0f, 30.0f);
  std::vector<float> x(n);
  for (std::size_t s = 0; s < n; s += 32) {
    const std::size_t e = s + 32 < n ? s + 32 : n;
    const int mode = kind == values::normal ? 0 : pick(g);
    const float scale = kind == values::normal ? 1.0f : std::pow(10.0f, expo(g));
    for (std::size_t i = s; i < e; ++i) {
      float v = normal(g);
      switch (mode) {
        case 0:
        case 1:
        case 2:
          v *= scale;
          break;
        case 3:
          v *= 1e-41f;
          break;  // subnormal
        case 4:
          v = std::max(-3e38f, std::min(3e38f, v * 1e38f));
          break;  // huge: ranges overflow
        case 5:
          v = (g() & 1) ? 0.0f : -0.0f;
          break;  // zeros of both signs
        case 6:
          v = std::fabs(v) * scale;
          if (g() % 8 == 0) v = (g() & 1) ? 0.0f : -0.0f;
          break;
        case 7:
          v = -std::fabs(v) * scale;
          if (g() % 8 == 0) v = (g() & 1) ? 0.0f : -0.0f;
          break;
        case 8:
          v = 0.75f;
          break;  // constant
        case 9:
          if (g() % 16 == 0) v = (g() & 1) ? INFINITY : -INFINITY;
          break;
        case 10:
          if (g() % 16 == 0) v = NAN;
          break;
        default:
          v = std::fabs(v) + 3.0f;
          break;  // one-sided, away from zero
      }
      x[i] = v;
    }
  }
  return x;
}

/// Compares two element arrays bit for bit; NaN matches NaN for float (IEEE leaves NaN
/// payloads to the platform) and must be the canonical quiet NaN for 16-bit types.
template <class T>
void require_same_values(const std::vector<T>& host, const std::vector<T>& device,
                         const std::string& what) {
  REQUIRE(host.size() == device.size());
  for (std::size_t i = 0; i < host.size(); ++i) {
    const std::uint32_t a = bits_of(host[i]), b = bits_of(device[i]);
    if (a == b) continue;
    const float fa = to_float(host[i]), fb = to_float(device[i]);
    if (sizeof(T) == 4 && fa != fa && fb != fb) continue;
    FAIL_CHECK(what << ": element " << i << " of " << host.size() << ": host bits 0x" << std::hex
                    << a << " device 0x" << b);
    return;
  }
}

/// Compares the first n bytes; one assertion either way (a test of equal frames asserts).
inline void require_same_bytes(const std::byte* host, const std::vector<std::byte>& device,
                               std::size_t n, const std::string& what) {
  REQUIRE(device.size() >= n);
  std::size_t i = 0;
  while (i < n && host[i] == device[i]) ++i;
  if (i < n)
    FAIL_CHECK(what << ": byte " << i << " of " << n << " differs: host 0x" << std::hex
                    << static_cast<int>(host[i]) << " device 0x" << static_cast<int>(device[i]));
}

/// Encodes x on the host and on the device and requires the same frame; then decodes
/// that frame both ways (scale 1 and a random other) and requires the same outputs.
/// `x_offset` elements shift the device input off 16-byte alignment.
template <class Codec, class T>
void check_encode_decode(const std::vector<float>& xf, std::uint64_t salt,
                         const kernels::launch_policy* policy = nullptr, std::size_t x_offset = 0) {
  using decoder = codec<typename Codec::quantizer_type>;  // decoding ignores the rounding
  const std::size_t n = xf.size();
  const std::vector<T> x = convert<T>(xf);
  auto g = rng(salt ^ 0x5151);
  const rng_key key{g(), static_cast<std::uint32_t>(g()), static_cast<std::uint32_t>(g() % 8),
                    static_cast<std::uint32_t>(g() % 2)};
  const std::uint64_t index0 = (g() % 100000) * 32;
  const std::size_t fb = Codec::frame_bytes(n);
  INFO("codec " << Codec::quantizer_type::name << " bits " << Codec::bits << " block "
                << Codec::block_size << " rounding " << Codec::rounding_type::name << " type "
                << numeric_traits<T>::name << " count " << n << " x_offset " << x_offset);

  host_frame hf(fb);
  host::encode<Codec>(span<const T>(x.data(), n), hf.bytes(), key, index0);

  device_array<T> dx(n + x_offset);
  if (n) dx.upload(x.data(), n, x_offset * sizeof(T));
  device_array<std::byte> df(fb);
  if (policy) {
    kernels::encode<Codec>(dx.data() + x_offset, n, df.data(), key, index0, feedback::none_ref{},
                           nullptr, *policy);
  } else {
    kernels::encode<Codec>(dx.data() + x_offset, n, df.data(), key, index0, feedback::none_ref{},
                           nullptr);
  }
  KT_CUDA(cudaDeviceSynchronize());
  // The whole frame (its meta padding zeroed on both sides) and 16 bytes beyond it, which
  // stay untouched.
  require_same_bytes(hf.data(), df.download(fb + 16), fb + 16, "encoded frame");

  for (const float scale : {1.0f, 0.25f + static_cast<float>(g() % 1000) / 1000.0f}) {
    std::vector<T> hy(n);
    host::decode<decoder>(hf.cbytes(), span<T>(hy.data(), n), scale);
    device_array<T> dy(n + x_offset);
    if (policy) {
      kernels::decode<decoder>(df.data(), n, dy.data() + x_offset, scale, nullptr, *policy);
    } else {
      kernels::decode<decoder>(df.data(), n, dy.data() + x_offset, scale, nullptr);
    }
    KT_CUDA(cudaDeviceSynchronize());
    require_same_values(hy, dy.download(n, x_offset * sizeof(T)),
                        "decoded (scale " + std::to_string(scale) + ")");
    // nothing written past the end
    const auto tail = dy.download(4, (n + x_offset) * sizeof(T));
    for (const T& t : tail) REQUIRE(bits_of(t) == (sizeof(T) == 4 ? 0xA7A7A7A7u : 0xA7A7u));
  }
}

/// The counts every codec is checked at: empty, one value, a block -1/0/+1, a partial
/// tile, several tiles with a ragged end.
inline const std::vector<std::size_t>& small_counts() {
  static const std::vector<std::size_t> c{0, 1, 127, 128, 129, 1000, 4099, 70001};
  return c;
}

/// Checks one codec (both roundings) for element type T at the small counts.
template <class Quantizer, class T>
void check_quantizer(std::uint64_t salt) {
  std::uint64_t k = 0;
  for (const std::size_t n : small_counts()) {
    ++k;
    const auto x = make_values(n, salt + 31 * k, (k % 2) ? values::awkward : values::normal);
    check_encode_decode<codec<Quantizer, round::nearest>, T>(x, salt + k);
    check_encode_decode<codec<Quantizer, round::stochastic>, T>(x, salt + 7 * k);
  }
}

/// check_quantizer over every width of a quantizer family.
template <template <int> class Family, class T, int... Bits>
void check_widths(std::integer_sequence<int, Bits...>, std::uint64_t salt) {
  (check_quantizer<Family<Bits>, T>(salt + 1000 * Bits), ...);
}

template <int B>
using absmax_full = quant::absmax<B, 128, quant::grid::full>;
template <int B>
using absmax_zero = quant::absmax<B, 128, quant::grid::zero>;
template <int B>
using minmax128 = quant::minmax<B, 128>;

/// 1..16 and 2..16.
using widths_1_16 =
    std::integer_sequence<int, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16>;
using widths_2_16 = std::integer_sequence<int, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16>;

}  // namespace lowbit::test
