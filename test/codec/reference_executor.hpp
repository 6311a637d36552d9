// The host codec executor as it was before it was vectorized and threaded: plain loops
// over one element at a time, kept as the reference the fast executor must match byte
// for byte (test only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "lowbit/codec/codec.hpp"
#include "lowbit/core/error.hpp"
#include "lowbit/core/numeric.hpp"
#include "lowbit/core/span.hpp"
#include "lowbit/feedback/refs.hpp"

namespace lowbit::host_reference {

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

template <class Codec>
typename Codec::meta_type load_meta(const std::byte* frame, std::size_t block) {
  typename Codec::meta_type m;
  std::memcpy(&m, frame + block * sizeof m, sizeof m);
  return m;
}

template <class Codec>
void load_group(const std::byte* frame, std::size_t count, std::size_t group,
                std::uint32_t (&codes)[Codec::group_size]) {
  std::uint32_t words[Codec::bits];
  std::memcpy(words, frame + Codec::codes_offset(count) + group * Codec::group_bytes, sizeof words);
  Codec::unpack(words, codes);
}

}  // namespace detail

/// Encodes x into `frame` (Codec::frame_bytes(x.size()) bytes, 16-byte aligned).
///
/// `index0` is the tensor index of x[0] (a multiple of 32): it keys stochastic rounding
/// so that a shard encodes as it would inside the whole tensor. `fb` is an error-feedback
/// ref (lowbit/feedback/refs.hpp) indexed from x[0]; a block holding inf/nan leaves the
/// feedback state untouched (the step will be skipped by the loss scaler: its error is
/// not real) and decodes to nan.
template <class Codec, class T, class Feedback = feedback::none_ref>
void encode(span<const T> x, span<std::byte> frame, const rng_key& key = {},
            std::uint64_t index0 = 0, Feedback fb = {}) {
  static_assert(is_codec_v<Codec>, "lowbit::host::encode: Codec must be a lowbit::codec<...>");
  static_assert(is_element_type_v<T>,
                "lowbit::host::encode: the element type must be float, __half or __nv_bfloat16");
  static_assert(feedback::is_feedback_ref_v<Feedback>,
                "lowbit::host::encode: fb must be a feedback ref (lowbit/feedback/refs.hpp)");
  const std::size_t count = x.size();
  LOWBIT_EXPECTS(count == 0 || x.data() != nullptr, "encode: x is null but count is nonzero");
  detail::check_frame<Codec>(frame.data(), frame.size(), count, "encode");
  LOWBIT_EXPECTS(index0 % Codec::group_size == 0, "encode: index0 must be a multiple of 32");
  constexpr int B = Codec::block_size, G = Codec::group_size;
  std::byte* codes_base = frame.data() + Codec::codes_offset(count);
  // The meta section's padding is zero (every byte of a frame is defined).
  for (std::size_t i = Codec::num_blocks(count) * sizeof(typename Codec::meta_type);
       i < Codec::codes_offset(count); ++i)
    frame.data()[i] = std::byte{0};

  for (std::size_t block = 0; block * B < count; ++block) {
    const std::size_t first = block * B;
    const int n = static_cast<int>(count - first < B ? count - first : B);
    float c[B];
    quant::block_stats stats;
    for (int i = 0; i < n; ++i) {
      c[i] = fb.load(first + i, to_float(x[first + i]));
      stats.add(c[i]);
    }
    const auto meta = Codec::quantizer_type::make_meta(stats);
    const auto params = Codec::quantizer_type::make_params(meta);
    std::memcpy(frame.data() + block * sizeof meta, &meta, sizeof meta);

    for (int g = 0; g < Codec::groups_per_block; ++g) {
      float xs[G] = {};
      const int valid = n - g * G < 0 ? 0 : (n - g * G < G ? n - g * G : G);
      for (int i = 0; i < valid; ++i) xs[i] = c[g * G + i];
      std::uint32_t codes[G], words[Codec::bits];
      Codec::quantize_group(xs, valid, params, key, index0 + first + g * G, codes);
      Codec::pack(codes, words);
      std::memcpy(codes_base + (block * Codec::groups_per_block + g) * Codec::group_bytes, words,
                  sizeof words);
      if (Feedback::active && !stats.poisoned()) {
        for (int i = 0; i < valid; ++i)
          fb.store(first + g * G + i, xs[i], Codec::quantizer_type::dequantize(codes[i], meta));
      }
    }
  }
}

/// Decodes a frame of `out.size()` values into out, multiplied by `scale` (1/P for avg).
template <class Codec, class T>
void decode(span<const std::byte> frame, span<T> out, float scale = 1.0f) {
  static_assert(is_codec_v<Codec>, "lowbit::host::decode: Codec must be a lowbit::codec<...>");
  static_assert(is_element_type_v<T>,
                "lowbit::host::decode: the element type must be float, __half or __nv_bfloat16");
  const std::size_t count = out.size();
  LOWBIT_EXPECTS(count == 0 || out.data() != nullptr, "decode: out is null but count is nonzero");
  detail::check_frame<Codec>(frame.data(), frame.size(), count, "decode");
  constexpr int G = Codec::group_size;
  for (std::size_t group = 0; group * G < count; ++group) {
    std::uint32_t codes[G];
    detail::load_group<Codec>(frame.data(), count, group, codes);
    const auto meta = detail::load_meta<Codec>(frame.data(), group / Codec::groups_per_block);
    const std::size_t first = group * G;
    const int valid = static_cast<int>(count - first < G ? count - first : G);
    for (int i = 0; i < valid; ++i) {
      float y = Codec::quantizer_type::dequantize(codes[i], meta);
      if (scale != 1.0f) y = lowbit::detail::fmul(y, scale);
      out[first + i] = from_float<T>(y);
    }
  }
}

/// acc[i] += decoded value i, in fp32: the reduction step of all_reduce.
template <class Codec>
void decode_accumulate(span<const std::byte> frame, span<float> acc) {
  static_assert(is_codec_v<Codec>,
                "lowbit::host::decode_accumulate: Codec must be a lowbit::codec<...>");
  const std::size_t count = acc.size();
  LOWBIT_EXPECTS(count == 0 || acc.data() != nullptr,
                 "decode_accumulate: acc is null but count is nonzero");
  detail::check_frame<Codec>(frame.data(), frame.size(), count, "decode_accumulate");
  constexpr int G = Codec::group_size;
  for (std::size_t group = 0; group * G < count; ++group) {
    std::uint32_t codes[G];
    detail::load_group<Codec>(frame.data(), count, group, codes);
    const auto meta = detail::load_meta<Codec>(frame.data(), group / Codec::groups_per_block);
    const std::size_t first = group * G;
    const int valid = static_cast<int>(count - first < G ? count - first : G);
    for (int i = 0; i < valid; ++i)
      acc[first + i] =
          lowbit::detail::fadd(acc[first + i], Codec::quantizer_type::dequantize(codes[i], meta));
  }
}

}  // namespace lowbit::host_reference

namespace lowbit::host_reference {

/// The middle of all_reduce: sums `num_frames` frames of one shard (frame p at
/// frames + p * frame_stride) in fp32, in order p = 0, 1, ..., then encodes the sum into
/// `out_frame` with feedback `fb` (a second-stage residual, or none). `acc` is scratch of
/// `count` floats and holds the exact fp32 sum afterwards.
template <class Codec, class Feedback = feedback::none_ref>
void decode_accumulate_encode(const std::byte* frames, std::size_t frame_stride, int num_frames,
                              span<float> acc, span<std::byte> out_frame, const rng_key& key = {},
                              std::uint64_t index0 = 0, Feedback fb = {}) {
  const std::size_t count = acc.size();
  LOWBIT_EXPECTS(num_frames >= 1, "decode_accumulate_encode: num_frames must be >= 1");
  LOWBIT_EXPECTS(
      frame_stride >= Codec::frame_bytes(count) && frame_stride % 16 == 0,
      "decode_accumulate_encode: frame_stride must hold a frame and be a multiple of 16");
  for (std::size_t i = 0; i < count; ++i) acc[i] = 0.0f;
  for (int p = 0; p < num_frames; ++p)
    decode_accumulate<Codec>(span<const std::byte>(frames + p * frame_stride, frame_stride), acc);
  encode<Codec>(span<const float>(acc.data(), count), out_frame, key, index0, fb);
}

}  // namespace lowbit::host_reference
