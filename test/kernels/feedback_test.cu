// Error feedback in the encode kernel: the frames and the updated state equal the host's,
// bit for bit, over several steps (residual in fp32 and bf16, EF21's local state).
#include "kernel_test_util.cuh"

namespace lowbit::test {

namespace {

template <class Codec, class T, template <class> class Ref, class R>
void check_feedback(std::size_t n, std::uint64_t salt, std::size_t state_offset = 0,
                    values kind = values::awkward) {
  INFO("codec " << Codec::quantizer_type::name << " bits " << Codec::bits << " type "
                << numeric_traits<T>::name << " state " << numeric_traits<R>::name << " count " << n
                << " state offset " << state_offset);
  const std::vector<T> x = convert<T>(make_values(n, salt, kind));
  std::vector<R> state = convert<R>(make_values(n, salt + 1, values::normal));
  for (auto& s : state) s = from_float<R>(to_float(s) * 0.01f);
  device_array<T> dx(n);
  if (n) dx.upload(x.data(), n);
  device_array<R> ds(n + state_offset);
  if (n) ds.upload(state.data(), n, state_offset * sizeof(R));
  const std::size_t fb = Codec::frame_bytes(n);
  for (std::uint32_t step = 0; step < 3; ++step) {
    const rng_key key{salt, step, 3, 0};
    host_frame hf(fb);
    host::encode<Codec>(span<const T>(x.data(), n), hf.bytes(), key, 64, Ref<R>{state.data()});
    device_array<std::byte> df(fb);
    kernels::encode<Codec>(dx.data(), n, df.data(), key, 64, Ref<R>{ds.data() + state_offset},
                           nullptr);
    KT_CUDA(cudaDeviceSynchronize());
    INFO("step " << step);
    require_same_bytes(hf.data(), df.download(fb + 16), fb + 16, "frame");
    require_same_values(state, ds.download(n, state_offset * sizeof(R)), "feedback state");
  }
}

template <class Codec, class T>
void check_all_refs(std::size_t n, std::uint64_t salt, std::size_t offset = 0) {
  check_feedback<Codec, T, feedback::residual_ref, float>(n, salt, offset);
  check_feedback<Codec, T, feedback::residual_ref, __nv_bfloat16>(n, salt + 10, offset);
  check_feedback<Codec, T, feedback::ef21_ref, float>(n, salt + 20, offset);
  check_feedback<Codec, T, feedback::ef21_ref, __nv_bfloat16>(n, salt + 30, offset);
}

/// A feedback ref the kernels do not know (classic error feedback written out by hand):
/// the kernels call it on global memory, element by element.
struct user_residual {
  static constexpr bool active = true;
  float* e = nullptr;
  LOWBIT_HD float load(std::size_t i, float x) const { return detail::fadd(x, e[i]); }
  LOWBIT_HD void store(std::size_t i, float c, float dq) const { e[i] = detail::fsub(c, dq); }
  LOWBIT_HD user_residual shifted(std::size_t offset) const { return {e + offset}; }
};

}  // namespace

TEST_CASE("a user-defined feedback ref is called in place", "[kernels][feedback][sanitize]") {
  using C = codec<quant::absmax<3>, round::stochastic>;
  for (const std::size_t n : {std::size_t{1}, std::size_t{129}, std::size_t{70001}}) {
    INFO("count " << n);
    const std::vector<float> x = make_values(n, 800 + n, values::awkward);
    std::vector<float> e = make_values(n, 900 + n, values::normal);
    for (auto& v : e) v *= 0.01f;
    device_array<float> dx(n), de(n);
    dx.upload(x.data(), n);
    de.upload(e.data(), n);
    const std::size_t fb = C::frame_bytes(n);
    for (std::uint32_t step = 0; step < 2; ++step) {
      const rng_key key{7, step, 1, 0};
      host_frame hf(fb);
      host::encode<C>(span<const float>(x.data(), n), hf.bytes(), key, 0, user_residual{e.data()});
      device_array<std::byte> df(fb);
      kernels::encode<C>(dx.data(), n, df.data(), key, 0, user_residual{de.data()}, nullptr);
      KT_CUDA(cudaDeviceSynchronize());
      require_same_bytes(hf.data(), df.download(fb + 16), fb + 16, "frame");
      require_same_values(e, de.download(n), "user state");
    }
  }
}

TEST_CASE("residual and EF21 state, fp32 and bf16: frames and state equal the host's",
          "[kernels][feedback][sanitize]") {
  for (const std::size_t n : {std::size_t{1}, std::size_t{129}, std::size_t{4099}}) {
    check_all_refs<codec<quant::absmax<4>, round::stochastic>, float>(n, 100 + n);
    check_all_refs<codec<quant::minmax<2>, round::nearest>, __nv_bfloat16>(n, 200 + n);
  }
  check_all_refs<codec<quant::fp8<quant::e4m3>, round::stochastic>, __half>(1000, 300);
  check_all_refs<codec<quant::absmax<3, 96, quant::grid::zero>, round::nearest>, float>(5000, 400);
}

TEST_CASE("feedback state off 16-byte alignment", "[kernels][feedback][sanitize]") {
  check_all_refs<codec<quant::absmax<4>, round::stochastic>, float>(4099, 500, 1);
}

TEST_CASE("feedback over many tiles", "[kernels][feedback]") {
  check_all_refs<codec<quant::absmax<4>, round::stochastic>, float>(1000003, 600);
  check_feedback<codec<quant::minmax<2>, round::nearest>, __nv_bfloat16, feedback::residual_ref,
                 __nv_bfloat16>(1000003, 700, 0, values::normal);
}

}  // namespace lowbit::test
