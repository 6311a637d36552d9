// decode_accumulate_encode and decode_accumulate vs the host: the re-encoded frame, the
// decoded sum and the second-stage residual, bit for bit.
#include "kernel_test_util.cuh"

namespace lowbit::test {

namespace {

template <class Codec, class T, bool Residual>
void check_reduce(std::size_t n, int frames, std::uint64_t salt, std::size_t extra_stride = 0) {
  INFO("codec " << Codec::quantizer_type::name << " bits " << Codec::bits << " rounding "
                << Codec::rounding_type::name << " sum type " << numeric_traits<T>::name
                << " count " << n << " frames " << frames << " residual " << Residual);
  const std::size_t fbytes = Codec::frame_bytes(n);
  const std::size_t stride = align16(fbytes) + 16 * extra_stride;
  host_frame in(stride * frames);
  for (int p = 0; p < frames; ++p) {
    const auto x = make_values(n, salt + 17 * p, p % 2 ? values::normal : values::awkward);
    host::encode<Codec>(span<const float>(x.data(), n),
                        span<std::byte>(in.data() + p * stride, stride),
                        rng_key{salt, 1, static_cast<std::uint32_t>(p), 0});
  }
  const rng_key key{salt, 2, 0, 1};
  const std::uint64_t index0 = 32 * (salt % 1000);
  std::vector<float> e = make_values(n, salt + 99, values::normal);
  for (auto& v : e) v *= 0.01f;

  std::vector<float> acc(n);
  host_frame out_h(fbytes);
  std::vector<float> e_h = e;
  if constexpr (Residual) {
    host::decode_accumulate_encode<Codec>(in.data(), stride, frames, span<float>(acc.data(), n),
                                          out_h.bytes(), key, index0,
                                          feedback::residual_ref<float>{e_h.data()});
  } else {
    host::decode_accumulate_encode<Codec>(in.data(), stride, frames, span<float>(acc.data(), n),
                                          out_h.bytes(), key, index0);
  }

  device_array<std::byte> d_in(stride * frames);
  d_in.upload(in.data(), stride * frames);
  device_array<std::byte> d_out(fbytes);
  device_array<T> d_sum(n);
  device_array<float> d_e(n);
  if (n) d_e.upload(e.data(), n);
  if constexpr (Residual) {
    kernels::decode_accumulate_encode<Codec>(d_in.data(), stride, frames, n, d_out.data(), key,
                                             index0, feedback::residual_ref<float>{d_e.data()},
                                             d_sum.data(), nullptr);
  } else {
    kernels::decode_accumulate_encode<Codec>(d_in.data(), stride, frames, n, d_out.data(), key,
                                             index0, feedback::none_ref{}, d_sum.data(), nullptr);
  }
  KT_CUDA(cudaDeviceSynchronize());
  require_same_bytes(out_h.data(), d_out.download(fbytes + 16), fbytes + 16, "re-encoded frame");
  require_same_values(convert<T>(acc), d_sum.download(n), "decoded sum");
  if constexpr (Residual) require_same_values(e_h, d_e.download(n), "second-stage residual");

  // The reduce_scatter half: the sum alone, scaled.
  const float scale = 1.0f / static_cast<float>(frames);
  std::vector<float> scaled(n);
  for (std::size_t i = 0; i < n; ++i) scaled[i] = scale != 1.0f ? acc[i] * scale : acc[i];
  device_array<T> d_avg(n);
  kernels::decode_accumulate<Codec>(d_in.data(), stride, frames, n, d_avg.data(), scale, nullptr);
  KT_CUDA(cudaDeviceSynchronize());
  require_same_values(convert<T>(scaled), d_avg.download(n), "decode_accumulate");

  // Without the decoded sum.
  device_array<std::byte> d_out2(fbytes);
  if constexpr (!Residual) {
    kernels::decode_accumulate_encode<Codec>(d_in.data(), stride, frames, n, d_out2.data(), key,
                                             index0, feedback::none_ref{}, nullptr, nullptr);
    KT_CUDA(cudaDeviceSynchronize());
    require_same_bytes(out_h.data(), d_out2.download(fbytes + 16), fbytes + 16, "frame, no sum");
  }

  // The frame and its own decoded values in one pass (all_reduce's own shard): the same
  // frame, and the bits host::decode of that frame gives, scaled.
  std::vector<T> decoded_h(n);
  host::decode<Codec>(span<const std::byte>(out_h.data(), fbytes), span<T>(decoded_h.data(), n),
                      scale);
  device_array<std::byte> d_out3(fbytes);
  device_array<T> d_decoded(n);
  if (n) d_e.upload(e.data(), n);
  if constexpr (Residual) {
    kernels::decode_accumulate_encode_decode<Codec>(
        d_in.data(), stride, frames, n, d_out3.data(), key, index0,
        feedback::residual_ref<float>{d_e.data()}, d_decoded.data(), scale, nullptr);
  } else {
    kernels::decode_accumulate_encode_decode<Codec>(d_in.data(), stride, frames, n, d_out3.data(),
                                                    key, index0, feedback::none_ref{},
                                                    d_decoded.data(), scale, nullptr);
  }
  KT_CUDA(cudaDeviceSynchronize());
  require_same_bytes(out_h.data(), d_out3.download(fbytes + 16), fbytes + 16,
                     "frame, with its decoded values");
  require_same_values(decoded_h, d_decoded.download(n), "decoded re-encoded values");
  if constexpr (Residual) require_same_values(e_h, d_e.download(n), "residual, decoded pass");
}

}  // namespace

TEST_CASE("decode-accumulate-encode equals the host", "[kernels][reduce][sanitize]") {
  for (const std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{127}, std::size_t{129}, std::size_t{4099}}) {
    for (const int p : {1, 2, 3}) {
      check_reduce<codec<quant::absmax<4>, round::stochastic>, float, false>(n, p, 10 + n + p);
      check_reduce<codec<quant::absmax<4>, round::stochastic>, __nv_bfloat16, true>(n, p,
                                                                                    20 + n + p, 1);
      check_reduce<codec<quant::minmax<3, 96>, round::nearest>, __half, false>(n, p, 30 + n + p, 2);
      check_reduce<codec<quant::fp8<quant::e5m2>, round::nearest>, float, true>(n, p, 40 + n + p);
    }
  }
}

TEST_CASE("decode-accumulate-encode over many tiles and 8 frames", "[kernels][reduce]") {
  check_reduce<codec<quant::absmax<8>, round::stochastic>, float, false>(10000003, 2, 50);
  check_reduce<codec<quant::absmax<2>, round::nearest>, __nv_bfloat16, true>(300007, 8, 60, 3);
  check_reduce<codec<quant::absmax<16, 32>, round::nearest>, float, true>(300007, 5, 70);
  check_reduce<codec<quant::absmax<1, 1024>, round::stochastic>, float, false>(300007, 4, 80);
}

}  // namespace lowbit::test
