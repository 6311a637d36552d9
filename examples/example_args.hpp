// Command-line options and the error report shared by the two all-reduce examples.
#pragma once

#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace example {

struct args {
  int bits = 4;
  std::size_t count = std::size_t(1) << 22;
  int iters = 20;
  std::uint64_t seed = 1;
  bool avg = false;
  bool flat = false;    ///< schedule::flat instead of pipelined<4> (NCCL example)
  bool verify = false;  ///< checked mode: a fingerprint all-gather before each call
  /// GPU example: nccl, or node (CUDA IPC, no NCCL; ranks may share a GPU)
  std::string backend = "nccl";
};

inline args parse(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&] {
      return i + 1 < argc
                 ? argv[++i]
                 : (std::fprintf(stderr, "%s needs a value\n", k.c_str()), std::exit(2), "");
    };
    if (k == "--bits")
      a.bits = std::atoi(next());
    else if (k == "--count")
      a.count = std::strtoull(next(), nullptr, 10);
    else if (k == "--iters")
      a.iters = std::atoi(next());
    else if (k == "--seed")
      a.seed = std::strtoull(next(), nullptr, 10);
    else if (k == "--avg")
      a.avg = true;
    else if (k == "--flat")
      a.flat = true;
    else if (k == "--verify")
      a.verify = true;
    else if (k == "--backend")
      a.backend = next();
    else {
      std::fprintf(stderr,
                   "usage: %s [--bits 1|2|4|8] [--count N] [--iters N] [--seed S] [--avg] [--flat] "
                   "[--verify] [--backend nccl|node]\n"
                   "  --flat and --backend: the GPU example (mpi_nccl_allreduce) only\n",
                   argv[0]);
      std::exit(k == "--help" || k == "-h" ? 0 : 2);
    }
  }
  if (a.backend != "nccl" && a.backend != "node") {
    std::fprintf(stderr, "%s: --backend is nccl or node, not '%s'\n", argv[0], a.backend.c_str());
    std::exit(2);
  }
  return a;
}

/// Bytes of a frame of `count` values at `bits` (one of 1, 2, 4, 8) under Codec<bits>.
template <template <int> class Codec>
std::size_t frame_bytes(int bits, std::size_t count) {
  switch (bits) {
    case 1:
      return Codec<1>::frame_bytes(count);
    case 2:
      return Codec<2>::frame_bytes(count);
    case 4:
      return Codec<4>::frame_bytes(count);
    default:
      return Codec<8>::frame_bytes(count);
  }
}

/// Rank r's input: normal(0, 1) + 0.01 r, from the seed.
inline std::vector<float> input(std::size_t count, int rank, std::uint64_t seed) {
  std::mt19937_64 g(seed * 1000003 + static_cast<std::uint64_t>(rank));
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(count);
  for (auto& v : x) v = d(g) + 0.01f * rank;
  return x;
}

/// Prints max and RMS error of `out` against the exact (fp64) reduction of every
/// rank's input, relative to the RMS of the exact result.
inline void report_error(const std::vector<float>& in, const std::vector<float>& out, bool avg) {
  int P = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<double> x(in.begin(), in.end()), exact(in.size());
  MPI_Allreduce(x.data(), exact.data(), static_cast<int>(x.size()), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  double max_err = 0, se = 0, sx = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double e = avg ? exact[i] / P : exact[i];
    max_err = std::max(max_err, std::abs(out[i] - e));
    se += (out[i] - e) * (out[i] - e);
    sx += e * e;
  }
  if (rank == 0)
    std::printf("error vs exact (fp64): max %.4g, rms %.4g, rms relative to the signal %.4g\n",
                max_err, std::sqrt(se / out.size()), std::sqrt(se / (sx > 0 ? sx : 1)));
}

}  // namespace example
