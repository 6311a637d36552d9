// Frame headers on the device (kernels/frame_check.cuh): the kernels that produce frames
// write the header in front of them, and the kernels that consume frames check every header
// of the call before writing a byte. A header that disagrees in any field leaves every output
// as it was (the poison bytes), records the first disagreement for the host (which words it
// with the same function as the MPI backend), and a reduce forwards it as a poisoned header.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernel_test_util.cuh"
#include "lowbit/collective/detail/agreement.hpp"
#include "lowbit/kernels/frame_check.cuh"

namespace {

namespace kernels = lowbit::kernels;
namespace host = lowbit::host;
namespace test = lowbit::test;
using lowbit::invalid_argument;
using lowbit::rng_key;
using lowbit::span;
using lowbit::detail::frame_header;
using lowbit::detail::header_field;
using lowbit::test::device_array;
using lowbit::test::poison_byte;
using C = lowbit::codec<lowbit::quant::absmax<4, 128>>;
constexpr int P = 3;
constexpr std::size_t H = sizeof(frame_header);

/// What rank `rank`'s call of `count` values says in its frames' headers.
frame_header call_header(std::uint32_t rank, std::uint64_t count) {
  frame_header h;
  h.magic = lowbit::detail::frame_magic;
  h.config = 0x1234'5678u;
  h.count = count;
  h.step = 7;
  h.seq = 3;
  h.bits = C::bits;
  h.rank = rank;
  return h;
}

/// A mismatch record in mapped host memory, as the NCCL backend keeps it.
struct mapped_record {
  mapped_record() {
    KT_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&r), sizeof *r, cudaHostAllocMapped));
    *r = kernels::header_mismatch{};
  }
  ~mapped_record() { cudaFreeHost(r); }
  kernels::header_mismatch* r = nullptr;
};

/// P slots of [header][frame of n values], the frames host-encoded from random values.
struct slots {
  explicit slots(std::size_t n)
      : n(n), stride(H + C::frame_bytes(n)), dev(P * stride), x(P), host(P * stride) {
    for (int p = 0; p < P; ++p) {
      x[p] = test::make_values(n, 100 + p, test::values::normal);
      const frame_header h = call_header(static_cast<std::uint32_t>(p), n);
      std::memcpy(host.data() + p * stride, &h, H);
      host::encode<C>(span<const float>(x[p].data(), n),
                      span<std::byte>(host.data() + p * stride + H, C::frame_bytes(n)));
    }
    upload();
  }
  void upload() { dev.upload(host.data(), host.size()); }
  /// Changes frame p's header.
  template <class F>
  void edit_header(int p, F&& f) {
    frame_header h;
    std::memcpy(&h, host.data() + p * stride, H);
    f(h);
    std::memcpy(host.data() + p * stride, &h, H);
    upload();
  }
  kernels::header_check check(const frame_header& want, kernels::header_mismatch* rec) const {
    return {{dev.data(), stride, P, want}, rec};
  }
  std::byte* frame(int p) const { return dev.data() + p * stride + H; }

  std::size_t n, stride;
  device_array<std::byte> dev;
  std::vector<std::vector<float>> x;
  std::vector<std::byte> host;
};

bool all_poison(const std::vector<std::byte>& v) {
  for (std::byte b : v)
    if (b != std::byte{poison_byte}) return false;
  return true;
}

/// No kernel wrote any of the first n values of `a` (they are still the poison bytes).
bool untouched(const device_array<float>& a, std::size_t n) {
  return all_poison(a.download_bytes(n * sizeof(float)));
}

/// One way for frame 2's header to disagree with rank 0's call, and the words for it.
struct disagreement {
  const char* name;
  header_field field;
  void (*edit)(frame_header&);
  const char* words;
};

const disagreement cases[] = {
    {"magic", header_field::magic, [](frame_header& h) { h.magic ^= 1; },
     "rank 2 sent bytes that are not a lowbit frame"},
    {"rank", header_field::rank, [](frame_header& h) { h.rank = 1; },
     "the frame from rank 2 says it comes from rank 1"},
    {"poisoned", header_field::poisoned,
     [](frame_header& h) { h.flags |= lowbit::detail::poisoned; },
     "rank 2 received a frame that did not match its call"},
    {"count", header_field::count, [](frame_header& h) { h.count += 20; },
     "rank 2's call has count 1020 where this rank's (rank 0) has 1000"},
    {"bits", header_field::bits, [](frame_header& h) { h.bits = 2; },
     "rank 2's call has code width (bits) 2 where this rank's (rank 0) has 4"},
    {"config", header_field::config, [](frame_header& h) { h.config ^= 0x100; },
     "rank 2's call uses another codec or configuration"},
    {"step", header_field::step, [](frame_header& h) { h.step = 8; },
     "rank 2's call has step 8 where this rank's (rank 0) has 7"},
    {"seq", header_field::seq, [](frame_header& h) { h.seq = 4; },
     "rank 2's call has call number 4 where this rank's (rank 0) has 3"},
};

/// The record names frame 2 and the field, in the host's words.
void require_recorded(const kernels::header_mismatch& m, const disagreement& d) {
  REQUIRE(m.ready == 1);
  REQUIRE(m.from == 2);
  REQUIRE(lowbit::detail::first_difference(m.got, m.want, 2) == d.field);
  const std::string words = lowbit::detail::mismatch(m.got, m.want, m.from);
  INFO(words);
  REQUIRE(words.find(d.words) != std::string::npos);
}

}  // namespace

TEST_CASE("encode writes its header in front of a frame that is the host's, byte for byte",
          "[sanitize]") {
  const std::size_t n = 1000;
  const std::vector<float> x = test::make_values(n, 1, test::values::awkward);
  device_array<float> dx(n);
  dx.upload(x.data(), n);
  const std::size_t fb = C::frame_bytes(n);
  device_array<std::byte> slot(H + fb);
  const frame_header h = call_header(1, n);
  kernels::encode<C>(dx.data(), n, slot.data() + H, rng_key{}, 0, lowbit::feedback::none_ref{},
                     nullptr, {slot.data(), h});
  KT_CUDA(cudaDeviceSynchronize());
  const std::vector<std::byte> got = slot.download(H + fb);

  std::vector<std::byte> want(H + fb);
  std::memcpy(want.data(), &h, H);
  test::host_frame f(fb);
  host::encode<C>(span<const float>(x.data(), n), span<std::byte>(f.data(), fb));
  std::memcpy(want.data() + H, f.data(), fb);
  REQUIRE(got == want);

  SECTION("no values: the header alone") {
    slot.poison();
    kernels::encode<C>(dx.data(), 0, slot.data() + H, rng_key{}, 0, lowbit::feedback::none_ref{},
                       nullptr, {slot.data(), h});
    KT_CUDA(cudaDeviceSynchronize());
    const std::vector<std::byte> only = slot.download(H + fb);
    REQUIRE(std::memcmp(only.data(), &h, H) == 0);
    REQUIRE(all_poison(std::vector<std::byte>(only.begin() + H, only.end())));
  }
}

TEST_CASE("decode and decode_accumulate write only when every header of the call agrees",
          "[sanitize]") {
  const std::size_t n = 1000;
  slots s(n);
  mapped_record rec;
  const frame_header want = call_header(0, n);
  device_array<float> out(n);

  SECTION("all agree: the host's values") {
    kernels::decode<C>(s.frame(1), n, out.data(), 1.0f, nullptr, s.check(want, rec.r));
    KT_CUDA(cudaDeviceSynchronize());
    std::vector<float> ref(n);
    host::decode<C>(span<const std::byte>(s.host.data() + s.stride + H, C::frame_bytes(n)),
                    span<float>(ref.data(), n));
    REQUIRE(out.download(n) == ref);
    kernels::decode_accumulate<C>(s.frame(0), s.stride, P, n, out.data(), 0.5f, nullptr,
                                  s.check(want, rec.r));
    KT_CUDA(cudaDeviceSynchronize());
    std::vector<float> acc(n);
    host::sum_frames<C>(s.host.data() + H, s.stride, P, span<float>(acc.data(), n), ref.data(),
                        0.5f);
    REQUIRE(out.download(n) == ref);
    REQUIRE(rec.r->ready == 0);
  }

  for (const disagreement& d : cases) {
    SECTION(std::string("frame 2's header differs in ") + d.name) {
      s.edit_header(2, d.edit);
      for (const bool sum : {false, true}) {
        INFO("decode_accumulate: " << sum);
        out.poison();
        *rec.r = kernels::header_mismatch{};
        if (sum)
          kernels::decode_accumulate<C>(s.frame(0), s.stride, P, n, out.data(), 1.0f, nullptr,
                                        s.check(want, rec.r));
        else
          kernels::decode<C>(s.frame(0), n, out.data(), 1.0f, nullptr, s.check(want, rec.r));
        KT_CUDA(cudaDeviceSynchronize());
        REQUIRE(untouched(out, n));
        require_recorded(*rec.r, d);
      }
    }
  }
}

TEST_CASE("a reduce whose inputs disagree writes a poisoned header and nothing else",
          "[sanitize]") {
  const std::size_t n = 1000;
  slots s(n);
  mapped_record rec;
  const frame_header want = call_header(0, n);
  const std::size_t fb = C::frame_bytes(n);
  device_array<std::byte> out_slot(H + fb);
  device_array<float> decoded(n);
  const bool with_decoded = GENERATE(false, true);
  const kernels::framing fr{s.check(want, rec.r), {out_slot.data(), want}};
  const auto run = [&] {
    if (with_decoded)
      kernels::decode_accumulate_encode_decode<C>(s.frame(0), s.stride, P, n, out_slot.data() + H,
                                                  rng_key{}, 0, lowbit::feedback::none_ref{},
                                                  decoded.data(), 1.0f, nullptr, fr);
    else
      kernels::decode_accumulate_encode<C>(s.frame(0), s.stride, P, n, out_slot.data() + H,
                                           rng_key{}, 0, lowbit::feedback::none_ref{}, nullptr,
                                           nullptr, fr);
    KT_CUDA(cudaDeviceSynchronize());
  };

  SECTION("all agree: the call's header and the host's frame") {
    run();
    std::vector<float> acc(n);
    test::host_frame ref(fb);
    host::decode_accumulate_encode<C>(s.host.data() + H, s.stride, P, span<float>(acc.data(), n),
                                      span<std::byte>(ref.data(), fb));
    const std::vector<std::byte> got = out_slot.download(H + fb);
    REQUIRE(std::memcmp(got.data(), &want, H) == 0);
    REQUIRE(std::memcmp(got.data() + H, ref.data(), fb) == 0);
    REQUIRE(rec.r->ready == 0);
  }
  SECTION("frame 2's count differs") {
    s.edit_header(2, cases[3].edit);
    run();
    const std::vector<std::byte> got = out_slot.download(H + fb);
    frame_header h;
    std::memcpy(&h, got.data(), H);
    frame_header poisoned = want;
    poisoned.flags |= lowbit::detail::poisoned;
    REQUIRE(std::memcmp(&h, &poisoned, H) == 0);
    REQUIRE(all_poison(std::vector<std::byte>(got.begin() + H, got.end())));
    REQUIRE(untouched(decoded, n));
    require_recorded(*rec.r, cases[3]);
  }
}

// The kernels judge the headers once per CTA (warp 0) and hand the verdict to the CTA's
// other warps: with many CTAs of many warps, every warp of every CTA must write (all agree)
// or none (one disagrees), and the frame and values must be the host's.
TEST_CASE("many CTAs of many warps take warp 0's verdict", "[sanitize]") {
  const std::size_t n = (std::size_t{1} << 20) + 1000;  // over a thousand decode tiles
  slots s(n);
  mapped_record rec;
  const frame_header want = call_header(0, n);
  const std::size_t fb = C::frame_bytes(n);
  device_array<float> out(n);
  device_array<std::byte> out_slot(H + fb);
  const auto run = [&] {
    out.poison();
    out_slot.poison();
    *rec.r = kernels::header_mismatch{};
    kernels::decode_accumulate<C>(s.frame(0), s.stride, P, n, out.data(), 1.0f, nullptr,
                                  s.check(want, rec.r));
    KT_CUDA(cudaDeviceSynchronize());
    kernels::decode_accumulate_encode<C>(s.frame(0), s.stride, P, n, out_slot.data() + H,
                                         rng_key{}, 0, lowbit::feedback::none_ref{}, nullptr,
                                         nullptr, {s.check(want, rec.r), {out_slot.data(), want}});
    KT_CUDA(cudaDeviceSynchronize());
  };
  SECTION("all agree") {
    run();
    std::vector<float> acc(n), sum(n);
    host::sum_frames<C>(s.host.data() + H, s.stride, P, span<float>(sum.data(), n));
    REQUIRE(out.download(n) == sum);
    test::host_frame ref(fb);
    host::decode_accumulate_encode<C>(s.host.data() + H, s.stride, P, span<float>(acc.data(), n),
                                      span<std::byte>(ref.data(), fb));
    const std::vector<std::byte> got = out_slot.download(H + fb);
    REQUIRE(std::memcmp(got.data() + H, ref.data(), fb) == 0);
    REQUIRE(rec.r->ready == 0);
  }
  SECTION("frame 2's step differs") {
    s.edit_header(2, cases[6].edit);
    run();
    REQUIRE(untouched(out, n));
    const std::vector<std::byte> got = out_slot.download(H + fb);
    REQUIRE(all_poison(std::vector<std::byte>(got.begin() + H, got.end())));
    require_recorded(*rec.r, cases[6]);
  }
}

TEST_CASE("an empty frame's header is poisoned when the headers it answers disagree") {
  slots s(100);
  mapped_record rec;
  const frame_header want = call_header(0, 100);
  device_array<std::byte> out_slot(H);
  SECTION("agree") {
    kernels::stamp_header({s.check(want, rec.r), {out_slot.data(), want}}, nullptr);
    KT_CUDA(cudaDeviceSynchronize());
    REQUIRE(std::memcmp(out_slot.download(H).data(), &want, H) == 0);
  }
  SECTION("disagree") {
    s.edit_header(2, cases[6].edit);
    kernels::stamp_header({s.check(want, rec.r), {out_slot.data(), want}}, nullptr);
    KT_CUDA(cudaDeviceSynchronize());
    frame_header h;
    std::memcpy(&h, out_slot.download(H).data(), H);
    REQUIRE((h.flags & lowbit::detail::poisoned) != 0);
    require_recorded(*rec.r, cases[6]);
  }
}

TEST_CASE("the first disagreement recorded stays, later ones do not overwrite it") {
  const std::size_t n = 1000;
  slots s(n);
  mapped_record rec;
  const frame_header want = call_header(0, n);
  device_array<float> out(n);
  s.edit_header(2, cases[7].edit);
  kernels::decode<C>(s.frame(0), n, out.data(), 1.0f, nullptr, s.check(want, rec.r));
  KT_CUDA(cudaDeviceSynchronize());
  s.edit_header(2, cases[3].edit);  // count and seq now both differ: count is named first
  kernels::decode<C>(s.frame(0), n, out.data(), 1.0f, nullptr, s.check(want, rec.r));
  KT_CUDA(cudaDeviceSynchronize());
  require_recorded(*rec.r, cases[7]);
}

TEST_CASE("misplaced headers are refused before launch") {
  slots s(100);
  device_array<float> out(100);
  kernels::header_check c = s.check(call_header(0, 100), nullptr);
  c.first += 8;
  REQUIRE_THROWS_AS(kernels::decode<C>(s.frame(0), 100, out.data(), 1.0f, nullptr, c),
                    invalid_argument);
  c = s.check(call_header(0, 100), nullptr);
  c.stride += 8;
  REQUIRE_THROWS_AS(kernels::decode<C>(s.frame(0), 100, out.data(), 1.0f, nullptr, c),
                    invalid_argument);
}
