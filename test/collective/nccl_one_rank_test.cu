// The NCCL backend on a one-rank communicator (one GPU): nothing crosses a wire, so every
// collective returns its input exactly and leaves its feedback state alone; checked mode
// and sync() work there too.
#include <catch2/catch.hpp>
#include <cuda_bf16.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "lowbit/collective/nccl.cuh"

namespace {

using bf16 = __nv_bfloat16;
using codec4 = lowbit::codec<lowbit::quant::absmax<4>, lowbit::round::stochastic>;

struct one_rank {
  ncclComm_t raw = nullptr;
  cudaStream_t stream = nullptr;
  one_rank() {
    int dev = 0;
    LOWBIT_NCCL_TRY(ncclCommInitAll(&raw, 1, &dev));
    LOWBIT_CUDA_TRY(cudaStreamCreate(&stream));
  }
  ~one_rank() {
    cudaStreamDestroy(stream);
    ncclCommDestroy(raw);
  }
};

template <class T>
struct dvec {
  T* p = nullptr;
  std::size_t n;
  explicit dvec(const std::vector<T>& h) : n(h.size()) {
    LOWBIT_CUDA_TRY(cudaMalloc(&p, n * sizeof(T)));
    LOWBIT_CUDA_TRY(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  dvec(const dvec&) = delete;
  ~dvec() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    LOWBIT_CUDA_TRY(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

std::vector<bf16> input(std::size_t n) {
  std::vector<bf16> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = __float2bfloat16(0.37f * float(i % 97) - 11.0f);
  return x;
}

}  // namespace

TEST_CASE("one rank: all_reduce, reduce_scatter and all_gather return the input exactly") {
  one_rank r;
  lowbit::comm::nccl_comm comm(r.raw);
  const std::size_t n = (std::size_t{1} << 20) + 123;  // above any crossover, not block-aligned
  const auto x = input(n);
  const std::vector<bf16> zeros(n, __float2bfloat16(0.0f));

  lowbit::all_reduce<bf16, codec4, lowbit::feedback::residual<float>> ar(comm, n);
  dvec<bf16> din(x), dout(zeros);
  ar(din.p, dout.p, n, r.stream);
  ar.sync(r.stream);
  CHECK(same_bytes(dout.get(), x));
  // In place: nothing happens at all.
  ar(din.p, din.p, n, r.stream);
  ar.sync(r.stream);
  CHECK(same_bytes(din.get(), x));
  // The residual was never touched: it is still zero.
  std::vector<float> e(n, 1.0f);
  LOWBIT_CUDA_TRY(cudaMemcpy(e.data(), ar.feedback_state().worker_ref().e, n * sizeof(float),
                             cudaMemcpyDeviceToHost));
  for (float v : e) REQUIRE(v == 0.0f);

  lowbit::collective_options avg;
  avg.op = lowbit::reduce_op::avg;
  lowbit::reduce_scatter<bf16, codec4> rs(comm, n, avg);
  dvec<bf16> s(zeros);
  rs(din.p, s.p, n, r.stream);
  rs.sync(r.stream);
  CHECK(same_bytes(s.get(), x));

  lowbit::all_gather<bf16, codec4> ag(comm, n);
  dvec<bf16> g(zeros);
  ag(din.p, g.p, n, r.stream);
  ag.sync(r.stream);
  CHECK(same_bytes(g.get(), x));
}

TEST_CASE("one rank: checked mode exchanges its fingerprint and runs") {
  one_rank r;
  lowbit::comm::nccl_comm comm(r.raw);
  lowbit::collective_options o;
  o.verify = true;
  o.timeout = std::chrono::seconds(20);
  const std::size_t n = 4096;
  const auto x = input(n);
  lowbit::all_reduce<bf16, codec4> ar(comm, n, o);
  dvec<bf16> din(x), dout(std::vector<bf16>(n, __float2bfloat16(0.0f)));
  for (int i = 0; i < 3; ++i) ar(din.p, dout.p, n, r.stream);
  ar.sync(r.stream);
  CHECK(same_bytes(dout.get(), x));
  CHECK(ar.step() == 3);
}
