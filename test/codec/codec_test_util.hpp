// Round-trip helpers for codec tests: encode on the host, decode, and expose each
// element's block step so that error bounds can be checked per element.
#pragma once

#include <cstddef>
#include <cstring>
#include <vector>

#include "lowbit/host/codec_executor.hpp"

namespace lowbit::test {

/// A 16-byte aligned byte buffer.
struct frame_buffer {
  explicit frame_buffer(std::size_t bytes) : storage((bytes + 15) / 16 + 1) {}
  std::byte* data() { return reinterpret_cast<std::byte*>(storage.data()); }
  const std::byte* data() const { return reinterpret_cast<const std::byte*>(storage.data()); }
  std::size_t size() const { return (storage.size() - 1) * 16; }
  span<std::byte> bytes() { return {data(), size()}; }
  span<const std::byte> cbytes() const { return {data(), size()}; }
  struct alignas(16) chunk {
    unsigned char b[16];
  };
  std::vector<chunk> storage;
};

template <class Codec>
struct roundtrip_result {
  frame_buffer frame;
  std::vector<float> y;     ///< decoded
  std::vector<float> step;  ///< the grid step of each element's block
};

template <class Codec, class T = float>
roundtrip_result<Codec> roundtrip(const std::vector<T>& x, rng_key key = {}) {
  const std::size_t n = x.size();
  roundtrip_result<Codec> r{frame_buffer(Codec::frame_bytes(n)), std::vector<float>(n),
                            std::vector<float>(n)};
  host::encode<Codec>(span<const T>(x.data(), n), r.frame.bytes(), key);
  host::decode<Codec>(r.frame.cbytes(), span<float>(r.y.data(), n));
  for (std::size_t i = 0; i < n; ++i) {
    typename Codec::meta_type m;
    std::memcpy(&m, r.frame.data() + (i / Codec::block_size) * sizeof m, sizeof m);
    r.step[i] = Codec::quantizer_type::step(m);
  }
  return r;
}

}  // namespace lowbit::test
