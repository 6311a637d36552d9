// lowbit-perf: timing and checking of one configuration (included by the generated
// per-configuration translation units).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <lowbit/collective/nccl.cuh>
#include <lowbit/collective/node.cuh>
#include <lowbit/comm/mpi_bootstrap.hpp>
#include <lowbit/comm/nccl_nodes.hpp>
#include <lowbit/lowbit.cuh>

#include "perf.hpp"
#include "timing.hpp"

namespace lowbit_perf {
namespace {

// ---- device helpers ---------------------------------------------------------------------

/// Deterministic N(0,1)-like inputs from Philox (sum of two uniforms, centred),
/// different on each rank.
template <class T>
__global__ void fill_kernel(T* x, std::size_t n, std::uint32_t rank) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const lowbit::philox_block r = lowbit::philox4x32<7>(
        {{std::uint32_t(i), std::uint32_t(i >> 32), rank, 0x5eed}}, 1234, 5678);
    const float u = (r.w[0] >> 8) * (1.0f / 16777216.0f) + (r.w[1] >> 8) * (1.0f / 16777216.0f);
    x[i] = lowbit::from_float<T>(2.449f * (u - 1.0f));
  }
}

template <class T>
__global__ void to_float_kernel(const T* x, float* y, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    y[i] = lowbit::to_float(x[i]);
}

/// The bits of an element, for bitwise comparison.
template <class T>
__device__ std::uint32_t bits_of(const T& x) {
  if constexpr (sizeof(T) == 4)
    return *reinterpret_cast<const std::uint32_t*>(&x);
  else
    return *reinterpret_cast<const std::uint16_t*>(&x);
}

/// acc[0] += sum (out - ref)^2, acc[1] += sum ref^2, acc[2] += non-finite outputs,
/// acc[3] += outputs whose bits differ from `same` (when given).
template <class T>
__global__ void compare_kernel(const T* out, const float* ref, const T* same, std::size_t n,
                               double* acc) {
  double err = 0, norm = 0, bad = 0, diff = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const float o = lowbit::to_float(out[i]);
    const double d = double(o) - ref[i];
    if (!isfinite(o))
      bad += 1;
    else
      err += d * d;
    norm += double(ref[i]) * ref[i];
    if (same && bits_of(out[i]) != bits_of(same[i])) diff += 1;
  }
  atomicAdd(&acc[0], err);
  atomicAdd(&acc[1], norm);
  atomicAdd(&acc[2], bad);
  atomicAdd(&acc[3], diff);
}

constexpr int grid_blocks = 1024, block_threads = 256;

template <class C, class = void>
struct has_algorithm : std::false_type {};
template <class C>
struct has_algorithm<C, std::void_t<decltype(std::declval<const C&>().algorithm())>>
    : std::true_type {};

/// The all_reduce algorithm a collective runs ("-" for reduce_scatter / all_gather).
template <class Coll>
const char* algorithm_name(const Coll& c) {
  if constexpr (has_algorithm<Coll>::value)
    return lowbit::to_string(c.algorithm());
  else
    return "-";
}

struct row {
  std::size_t bytes, count;
  double lowbit_us, nccl_us, rel_err, wire_ratio;
  long wrong;
};

/// The check's exact collectives on device buffers: NCCL's where it runs, else MPI's on
/// host copies (ranks that share a GPU, where NCCL refuses to run). All on `s`.
class exact {
 public:
  exact(lowbit::comm::nccl_comm* nccl, cudaStream_t s) : nccl_(nccl), s_(s) {
    MPI_Comm_size(MPI_COMM_WORLD, &P_);
  }

  /// out[0, n) = the sum (or mean) over the ranks of in[0, n), in fp32.
  void all_reduce(const float* in, float* out, std::size_t n, bool avg) {
    if (nccl_) {
      LOWBIT_NCCL_TRY(
          ncclAllReduce(in, out, n, ncclFloat32, avg ? ncclAvg : ncclSum, nccl_->get(), s_));
      return;
    }
    float* h = host<float>(in, n);
    for (std::size_t i = 0; i < n; i += piece)
      MPI_Allreduce(MPI_IN_PLACE, h + i, int(std::min(piece, n - i)), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    if (avg)
      for (std::size_t i = 0; i < n; ++i) h[i] /= float(P_);
    to_device(out, n * sizeof(float));
  }
  /// dst[0, bytes) = rank `root`'s src[0, bytes) (dst may be src).
  void broadcast(const void* src, void* dst, std::size_t bytes, int root = 0) {
    if (nccl_) {
      LOWBIT_NCCL_TRY(ncclBroadcast(src, dst, bytes, ncclUint8, root, nccl_->get(), s_));
      return;
    }
    bcast(host<char>(src, bytes), bytes, root);
    to_device(dst, bytes);
  }
  /// out[r] = rank p's in[r] for the range r = ranges[p] of every rank p.
  void gather(const float* in, float* out, const std::vector<lowbit::schedule::range>& ranges,
              std::size_t n) {
    if (nccl_) {
      LOWBIT_NCCL_TRY(ncclGroupStart());
      for (int p = 0; p < P_; ++p)
        broadcast(in + ranges[p].begin, out + ranges[p].begin, ranges[p].count * sizeof(float), p);
      LOWBIT_NCCL_TRY(ncclGroupEnd());
      return;
    }
    float* h = host<float>(in, n);
    for (int p = 0; p < P_; ++p) bcast(h + ranges[p].begin, ranges[p].count * sizeof(float), p);
    to_device(out, n * sizeof(float));
  }

 private:
  static constexpr std::size_t piece = std::size_t(1) << 28;  ///< MPI counts are int
  /// A host copy of d[0, n) (after the work on the stream).
  template <class U>
  U* host(const void* d, std::size_t n) {
    h_.resize(n * sizeof(U));
    LOWBIT_CUDA_TRY(cudaMemcpyAsync(h_.data(), d, n * sizeof(U), cudaMemcpyDeviceToHost, s_));
    LOWBIT_CUDA_TRY(cudaStreamSynchronize(s_));
    return reinterpret_cast<U*>(h_.data());
  }
  void to_device(void* d, std::size_t bytes) {
    LOWBIT_CUDA_TRY(cudaMemcpyAsync(d, h_.data(), bytes, cudaMemcpyHostToDevice, s_));
    LOWBIT_CUDA_TRY(cudaStreamSynchronize(s_));  // h_ is pageable and reused
  }
  static void bcast(void* h, std::size_t bytes, int root) {
    for (std::size_t i = 0; i < bytes; i += piece)
      MPI_Bcast(static_cast<char*>(h) + i, int(std::min(piece, bytes - i)), MPI_BYTE, root,
                MPI_COMM_WORLD);
  }

  lowbit::comm::nccl_comm* nccl_;
  cudaStream_t s_;
  int P_ = 1;
  std::vector<char> h_;
};

// ---- the phases of an all_reduce, one at a time -----------------------------------------

/// Times each pass of both all_reduce algorithms, reduce_scatter and all_gather alone at
/// `count` values (no feedback unless named, flat, this rank's first shard): the serial
/// sum is what a flat call costs, and the larger of its transfer and its codec passes is
/// what a pipelined one cannot go below. Bytes are what each pass moves through this
/// GPU's HBM, or sends per rank for the transfers.
template <class T, class Codec>
void breakdown(const options& o, lowbit::comm::nccl_comm& comm, const T* in, T* out,
               std::size_t count, cudaStream_t s) {
  namespace k = lowbit::kernels;
  const int P = comm.size();
  const std::size_t shard = lowbit::schedule::shard(count, Codec::block_size, P, 0).count;
  const std::size_t F = Codec::frame_bytes(count), f = Codec::frame_bytes(shard);
  // The frames live and move as the collectives' do: the NCCL backend's own transport
  // (--transport), one lane, no internal streams.
  using lowbit::detail::lane;
  lowbit::detail::backend_impl<lowbit::backend::nccl> be(comm, 0, 1);
  be.set_transport(o.transport, o.policy, Codec::bits);
  auto frame_buf = be.make_transfer_buffer(F * P), piece_buf = be.make_transfer_buffer(f * (P + 1));
  std::byte *frames = frame_buf.data(), *pieces = piece_buf.data();
  lowbit::detail::call_check no_check;  // the NCCL backend's transfers do not check frames
  const auto all_gather = [&](const lowbit::transport::window_buffer& buf, std::size_t slot,
                              cudaStream_t st) {
    be.begin(st, false);
    be.allgather(lane::comm, buf, 0, slot, Codec::bits, no_check);
    be.end();
  };
  __nv_bfloat16* residual;
  LOWBIT_CUDA_TRY(cudaMalloc(&residual, count * sizeof(__nv_bfloat16)));
  LOWBIT_CUDA_TRY(cudaMemsetAsync(residual, 0, count * sizeof(__nv_bfloat16), s));
  const lowbit::rng_key key{1, 2, 3, 0};
  ncclComm_t c = comm.get();
  const int rank = comm.rank();
  // Which calls a pass belongs to.
  enum : unsigned { one_shot = 1, two_phase = 2, gather = 4, scatter = 8 };
  struct pass {
    const char* name;
    unsigned in;
    double bytes;
    std::function<void(cudaStream_t)> fn;
  };
  const double t = sizeof(T);
  const auto sendrecv = [&](cudaStream_t st) {
    LOWBIT_NCCL_TRY(ncclGroupStart());
    for (int p = 0; p < P; ++p) {
      if (p == rank) continue;
      LOWBIT_NCCL_TRY(ncclSend(pieces + rank * f, f, ncclUint8, p, c, st));
      LOWBIT_NCCL_TRY(ncclRecv(frames + p * f, f, ncclUint8, p, c, st));  // scratch
    }
    LOWBIT_NCCL_TRY(ncclGroupEnd());
  };
  const std::vector<pass> passes = {
      {"encode (whole)", one_shot | two_phase | scatter, count * t + F,
       [&](cudaStream_t st) {
         k::encode<Codec>(in, count, frames + rank * F, key, 0, lowbit::feedback::none_ref{}, st);
       }},
      {"encode (whole) + bf16 residual", 0, count * t + F + 4.0 * count,
       [&](cudaStream_t st) {
         k::encode<Codec>(in, count, frames + rank * F, key, 0,
                          lowbit::feedback::residual_ref<__nv_bfloat16>{residual}, st);
       }},
      {"all-gather frames (one_shot)", one_shot, double(F) * (P - 1),
       [&](cudaStream_t st) { all_gather(frame_buf, F, st); }},
      {"decode-sum P frames (one_shot)", one_shot, double(F) * P + count * t,
       [&](cudaStream_t st) { k::decode_accumulate<Codec>(frames, F, P, count, out, 1.0f, st); }},
      {"send/recv shard frames (two_phase, r_s)", two_phase | scatter, double(f) * (P - 1),
       sendrecv},
      {"decode-sum-encode-decode shard (two_phase)", two_phase, double(f) * (P + 1) + shard * t,
       [&](cudaStream_t st) {
         k::decode_accumulate_encode_decode<Codec>(pieces, f, P, shard, pieces + P * f, key, 0,
                                                   lowbit::feedback::none_ref{}, out, 1.0f, st);
       }},
      {"all-gather shard frames (two_phase, a_g)", two_phase | gather, double(f) * (P - 1),
       [&](cudaStream_t st) { all_gather(piece_buf, f, st); }},
      {"decode (P-1) shards (two_phase)", two_phase, (double(f) + shard * t) * (P - 1),
       [&](cudaStream_t st) {
         for (int p = 1; p < P; ++p) k::decode<Codec>(pieces, shard, out + p * shard, 1.0f, st);
       }},
      {"decode-sum shard (reduce_scatter)", scatter, double(f) * P + shard * t,
       [&](cudaStream_t st) { k::decode_accumulate<Codec>(pieces, f, P, shard, out, 1.0f, st); }},
      {"encode my shard (all_gather)", gather, shard * t + f,
       [&](cudaStream_t st) {
         k::encode<Codec>(in, shard, pieces + P * f, key, 0, lowbit::feedback::none_ref{}, st);
       }},
      {"decode P shards (all_gather)", gather, (double(f) + shard * t) * P,
       [&](cudaStream_t st) {
         for (int p = 0; p < P; ++p)
           k::decode<Codec>(pieces + p * f, shard, out + p * shard, 1.0f, st);
       }},
  };
  // Valid frames wherever a pass decodes (the send/recv pass lands in `frames`, after the
  // one_shot passes; the other passes use `pieces`).
  for (int p = 0; p < P; ++p) {
    k::encode<Codec>(in, count, frames + p * F, key, 0, lowbit::feedback::none_ref{}, s);
    k::encode<Codec>(in + p * shard, shard, pieces + p * f, key, 0, lowbit::feedback::none_ref{},
                     s);
  }
  if (rank == 0)
    std::printf(
        "# breakdown at %zu bytes (%zu values, %d ranks, all-gathers by %s): each pass alone\n"
        "# %-44s %10s %12s %9s\n",
        count * sizeof(T), count, P, lowbit::to_string(be.transport()), "pass", "us", "bytes",
        "GB/s");
  double sum[4] = {0, 0, 0, 0};
  for (const auto& ps : passes) {
    const double us = time_median_us(ps.fn, s, o.warmup, o.iters);
    for (int i = 0; i < 4; ++i)
      if (ps.in & (1u << i)) sum[i] += us;
    if (rank == 0)
      std::printf("  %-44s %10.1f %12.0f %9.1f\n", ps.name, us, ps.bytes, ps.bytes / us / 1e3);
  }
  if (rank == 0)
    std::printf(
        "# serial sums: all_reduce one_shot %.1f us, two_phase %.1f us; all_gather %.1f us; "
        "reduce_scatter %.1f us\n",
        sum[0], sum[1], sum[2], sum[3]);
  comm.sync(s);
  cudaFree(residual);
}

// ---- one configuration ------------------------------------------------------------------

enum class coll_kind { all_reduce, reduce_scatter, all_gather };

template <class T, class Collective, coll_kind Kind>
void run(const options& o, const comms& c, std::FILE* csv) {
  using codec = typename Collective::codec_type;
  using Backend = typename Collective::backend_type;
  // The node backend has no crossover, hierarchical collective or breakdown here: main
  // refuses those options under --backend node.
  constexpr bool on_nccl = std::is_same_v<Backend, lowbit::backend::nccl>;
  auto& comm = c.of<Backend>();
  lowbit::comm::nccl_comm* const nccl = c.nccl;  // NCCL's baseline; null where it cannot run
  const int P = comm.size(), rank = comm.rank();
  const std::size_t max_count = o.max_bytes / sizeof(T);
  lowbit::collective_options copts;
  copts.op = o.op == "avg" ? lowbit::reduce_op::avg : lowbit::reduce_op::sum;
  copts.seed = 2026;
  copts.algorithm = o.algorithm == "one_shot"    ? lowbit::all_reduce_algorithm::one_shot
                    : o.algorithm == "two_phase" ? lowbit::all_reduce_algorithm::two_phase
                                                 : lowbit::all_reduce_algorithm::automatic;
  copts.transport = o.transport;
  copts.transport_policy = o.policy;
  Collective coll(comm, max_count, copts);
  // The hierarchical all_reduce over nodes of G consecutive ranks, when asked: stage 2 at
  // the same codec, feedback and schedule as `coll`.
  struct no_hier {  // what the node backend has instead
    void async(const T*, T*, std::size_t, cudaStream_t) {}
    void set_step(std::uint32_t) {}
  };
  using hier_type = std::conditional_t<
      on_nccl,
      lowbit::hierarchical_all_reduce<T, codec, typename Collective::feedback_type,
                                      lowbit::full_precision, typename Collective::schedule_type>,
      no_hier>;
  const int G = Kind == coll_kind::all_reduce ? o.ranks_per_node : 0;
  const int G1 = std::max(G, 1);  // G is the constant 0 where Kind is not all_reduce
  LOWBIT_EXPECTS(G == 0 || (G >= 1 && P % G1 == 0),
                 "lowbit-perf: --ranks-per-node must divide the number of ranks");
  lowbit::comm::node_comms<lowbit::comm::nccl_comm> nodes;
  std::unique_ptr<hier_type> hier;
  cudaStream_t stream;
  LOWBIT_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if constexpr (on_nccl) {
    if (G > 0) {
      nodes = lowbit::comm::split_by_node(comm, rank / G1);
      hier = std::make_unique<hier_type>(nodes.intra, nodes.inter, max_count, copts);
    }
    if (o.crossover == "auto") {
      lowbit::calibrate_crossover(coll, comm, stream);
    } else {
      coll.set_crossover_bytes(parse_size(o.crossover.c_str()));
    }
  }
  exact reference(nccl, stream);
  // Waits for the stream: lowbit's errors (a timeout, a disagreement) and NCCL's.
  const auto wait = [&] {
    coll.sync(stream);
    if (nccl) nccl->sync(stream);
  };

  T *in, *out, *nccl_out, *same;
  float *in_f, *ref;
  double* acc;
  LOWBIT_CUDA_TRY(cudaMalloc(&in, max_count * sizeof(T)));
  LOWBIT_CUDA_TRY(cudaMalloc(&out, max_count * sizeof(T)));
  LOWBIT_CUDA_TRY(cudaMalloc(&nccl_out, max_count * sizeof(T)));
  LOWBIT_CUDA_TRY(cudaMalloc(&same, max_count * sizeof(T)));
  LOWBIT_CUDA_TRY(cudaMalloc(&in_f, max_count * sizeof(float)));
  LOWBIT_CUDA_TRY(cudaMalloc(&ref, max_count * sizeof(float)));
  LOWBIT_CUDA_TRY(cudaMalloc(&acc, 4 * sizeof(double)));
  const ncclRedOp_t nop = o.op == "avg" ? ncclAvg : ncclSum;

  if (rank == 0) {
    std::printf(
        "# lowbit-perf  backend %s  coll %s  type %s  op %s  bits %d  feedback %s  schedule %s"
        "  ranks %d  crossover %zu B%s  algorithm %s  transport %s\n",
        Backend::name, o.coll.c_str(), o.dtype.c_str(), o.op.c_str(), o.bits, o.feedback.c_str(),
        o.schedule.c_str(), P, coll.crossover_bytes(), o.crossover == "auto" ? " (calibrated)" : "",
        algorithm_name(coll), lowbit::to_string(coll.transport()));
    if (on_nccl) std::printf("# %s\n", lowbit::transport::to_string(o.policy).c_str());
    if (c.ranks_per_gpu > 1)
      std::printf(
          "# %d ranks share one GPU: they time-slice it and share its HBM, so these timings "
          "are not speed-ups (time the node backend between GPUs for that)\n"
          "# NCCL baseline unavailable: %d ranks share one GPU (check references by MPI)\n",
          c.ranks_per_gpu, c.ranks_per_gpu);
    if (G > 0)
      std::printf(
          "# hier: %d nodes x %d ranks; hier columns: its time, busbw (of the whole "
          "job), #wrong and speedup over NCCL's flat all-reduce\n",
          P / G1, G);
    std::printf("#%11s %12s %6s %5s | %10s %8s %8s %7s | %10s %8s %8s | %7s %6s %9s", "size",
                "count", "type", "redop", "time(us)", "algbw", "busbw", "#wrong", "nccl(us)",
                "algbw", "busbw", "speedup", "wire", "rel_err");
    if (G > 0) std::printf(" | %10s %8s %7s %7s", "hier(us)", "busbw", "#wrong", "speedup");
    std::printf("\n");
  }
  const double bus = Kind == coll_kind::all_reduce ? 2.0 * (P - 1) / P : double(P - 1) / P;

  for (double b = double(o.min_bytes); b <= double(o.max_bytes) * 1.0000001; b *= o.factor) {
    std::size_t count = std::size_t(b) / sizeof(T);
    if (Kind != coll_kind::all_reduce) count -= count % P;  // NCCL needs equal shards
    if (count == 0) continue;
    const std::size_t bytes = count * sizeof(T);
    fill_kernel<<<grid_blocks, block_threads, 0, stream>>>(in, count, rank);
    LOWBIT_CHECK_LAUNCH();

    // lowbit and NCCL on the same input buffer.
    const std::size_t shard = count / P;
    const auto lowbit_call = [&](cudaStream_t s) {
      if constexpr (Kind == coll_kind::all_gather) {
        const auto r = coll.shard(count);
        coll.async(in + r.begin, out, count, s);
      } else {
        coll.async(in, out, count, s);
      }
    };
    const auto nccl_call = [&](cudaStream_t s) {
      if constexpr (Kind == coll_kind::all_reduce) {
        LOWBIT_NCCL_TRY(ncclAllReduce(in, nccl_out, count, lowbit::comm::nccl_data_type<T>(), nop,
                                      nccl->get(), s));
      } else if constexpr (Kind == coll_kind::reduce_scatter) {
        LOWBIT_NCCL_TRY(ncclReduceScatter(in, nccl_out, shard, lowbit::comm::nccl_data_type<T>(),
                                          nop, nccl->get(), s));
      } else {
        LOWBIT_NCCL_TRY(ncclAllGather(in + rank * shard, nccl_out, shard,
                                      lowbit::comm::nccl_data_type<T>(), nccl->get(), s));
      }
    };
    const double t_low = time_median_us(lowbit_call, stream, o.warmup, o.iters);
    const double t_nccl = nccl ? time_median_us(nccl_call, stream, o.warmup, o.iters) : NAN;
    const auto hier_call = [&](cudaStream_t s) { hier->async(in, out, count, s); };
    const double t_hier = hier ? time_median_us(hier_call, stream, o.warmup, o.iters) : 0;
    long hier_wrong = 0;

    row r{bytes, count, t_low, t_nccl, 0, 0, 0};
    // Wire bytes per rank: lowbit frames vs NCCL's elements (same algorithmic factor).
    r.wire_ratio = double(bytes) / double(codec::frame_bytes(count));
    if (o.check) {
      // Reference: the exact collective of fp32 copies (exact to fp32 rounding).
      to_float_kernel<<<grid_blocks, block_threads, 0, stream>>>(in, in_f, count);
      LOWBIT_CHECK_LAUNCH();
      std::size_t check_n = count, ref_offset = 0;
      coll.set_step(0);
      lowbit_call(stream);
      wait();
      if constexpr (Kind == coll_kind::all_reduce) {
        reference.all_reduce(in_f, ref, count, o.op == "avg");
      } else if constexpr (Kind == coll_kind::reduce_scatter) {
        reference.all_reduce(in_f, ref, count, o.op == "avg");
        const auto sh = coll.shard(count);
        check_n = sh.count;
        ref_offset = sh.begin;
      } else {
        // Each rank's shard as lowbit cuts it, gathered exactly: broadcast from owners.
        std::vector<lowbit::schedule::range> shards;
        for (int p = 0; p < P; ++p)
          shards.push_back(lowbit::schedule::shard(count, codec::block_size, P, p));
        reference.gather(in_f, ref, shards, count);
      }
      // out against ref: {squared error, squared norm, #bad, #differing from rank 0}.
      const auto compare = [&](double* h) {
        const T* same_ptr = nullptr;
        if constexpr (Kind != coll_kind::reduce_scatter) {
          reference.broadcast(out, same, count * sizeof(T));
          same_ptr = same;
        }
        LOWBIT_CUDA_TRY(cudaMemsetAsync(acc, 0, 4 * sizeof(double), stream));
        compare_kernel<<<grid_blocks, block_threads, 0, stream>>>(out, ref + ref_offset, same_ptr,
                                                                  check_n, acc);
        LOWBIT_CHECK_LAUNCH();
        wait();
        LOWBIT_CUDA_TRY(cudaMemcpy(h, acc, 4 * sizeof(double), cudaMemcpyDeviceToHost));
        MPI_Allreduce(MPI_IN_PLACE, h, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      };
      double h[4];
      compare(h);
      r.rel_err = h[1] > 0 ? std::sqrt(h[0] / h[1]) : 0;
      r.wrong = long(h[2] + h[3]);
      if (hier) {
        hier->set_step(0);
        hier_call(stream);
        compare(h);
        hier_wrong = long(h[2] + h[3]);
      }
    }
    if constexpr (Kind == coll_kind::all_reduce && on_nccl) {
      if (o.breakdown && b * o.factor > double(o.max_bytes) * 1.0000001)  // the largest size
        breakdown<T, codec>(o, comm, in, out, count, stream);
    }
    if (rank == 0) {
      const double alg_l = bytes / t_low / 1e3, alg_n = bytes / t_nccl / 1e3;
      std::printf(" %11zu %12zu %6s %5s | %10.1f %8.2f %8.2f %7ld |", bytes, count, o.dtype.c_str(),
                  o.op.c_str(), t_low, alg_l, alg_l * bus, r.wrong);
      if (nccl)
        std::printf(" %10.1f %8.2f %8.2f | %6.2fx", t_nccl, alg_n, alg_n * bus, t_nccl / t_low);
      else  // no baseline, and no speed-up
        std::printf(" %10s %8s %8s | %7s", "-", "-", "-", "-");
      std::printf(" %5.2fx %9.2e", r.wire_ratio, r.rel_err);
      if (hier)
        std::printf(" | %10.1f %8.2f %7ld %6.2fx", t_hier, bytes / t_hier / 1e3 * bus, hier_wrong,
                    t_nccl / t_hier);
      std::printf("\n");
      std::fflush(stdout);
      if (csv)
        std::fprintf(csv,
                     "%s,%s,%s,%s,%d,%s,%s,%d,%zu,%zu,%.3f,%.3f,%.3f,%.3f,%.4f,%.4f,%.3e,%ld,"
                     "%s,%s,%s\n",
                     o.regime.c_str(), o.coll.c_str(), o.dtype.c_str(), o.op.c_str(), o.bits,
                     o.feedback.c_str(), o.schedule.c_str(), P, bytes, count, t_low, alg_l * bus,
                     t_nccl, alg_n * bus, t_nccl / t_low, r.wire_ratio, r.rel_err, r.wrong,
                     algorithm_name(coll), lowbit::to_string(coll.transport()), Backend::name);
    }
  }
  wait();
  for (void* p :
       {(void*)in, (void*)out, (void*)nccl_out, (void*)same, (void*)in_f, (void*)ref, (void*)acc})
    cudaFree(p);
  cudaStreamDestroy(stream);
}

// ---- dispatch over the compiled configurations --------------------------------------------

template <int Bits>
using codec_of = lowbit::codec<lowbit::quant::absmax<Bits>, lowbit::round::stochastic>;

}  // namespace

/// Calls fn(S{}) for the schedule named `name`: default (the library's
/// schedule::default_schedule, ramped<>), flat, pipelined (pipelined<>: 4 equal chunks of
/// at least 2^25 values), pipelined<K> with K = 2, 4, 8, 16 equal chunks of at least 2^20
/// values ("pipelined2" ...), or ramped23 (ramped<8, 2^23>), for tuning. False for an
/// unknown name. `tuning` false: only default and flat, to keep the build short for the
/// configurations that are not tuned (feedback other than none).
template <bool tuning = true, class Fn>
bool with_schedule(const std::string& name, Fn&& fn) {
  using namespace lowbit::schedule;
  constexpr std::size_t small = std::size_t{1} << 20;
  if (name == "flat") return fn(flat{}), true;
  if (name == "default") return fn(default_schedule{}), true;
  if constexpr (!tuning) return false;
  if (name == "pipelined") return fn(pipelined<>{}), true;
  if (name == "pipelined2") return fn(pipelined<2, small>{}), true;
  if (name == "pipelined4") return fn(pipelined<4, small>{}), true;
  if (name == "pipelined8") return fn(pipelined<8, small>{}), true;
  if (name == "pipelined16") return fn(pipelined<16, small>{}), true;
  if (name == "ramped23") return fn(ramped<8, (std::size_t{1} << 23)>{}), true;
  return false;
}

template <class T, int Bits, class B>
bool dispatch(const options& o, const comms& c, std::FILE* csv) {
  using C = codec_of<Bits>;
  using namespace lowbit;
  if (o.coll == "reduce_scatter" || o.coll == "all_gather") {
    if (o.feedback != "none") return false;
    return with_schedule(o.schedule, [&](auto sched) {
      using S = decltype(sched);
      if (o.coll == "reduce_scatter")
        run<T, reduce_scatter<T, C, feedback::none, S, B>, coll_kind::reduce_scatter>(o, c, csv);
      else
        run<T, all_gather<T, C, S, B>, coll_kind::all_gather>(o, c, csv);
    });
  }
  if (o.coll != "all_reduce") return false;
  if (o.feedback == "none")
    return with_schedule(o.schedule, [&](auto sched) {
      run<T, all_reduce<T, C, feedback::none, decltype(sched), B>, coll_kind::all_reduce>(o, c,
                                                                                          csv);
    });
  bool known = true;
  const bool scheduled = with_schedule<false>(o.schedule, [&](auto sched) {
    using S = decltype(sched);
    if (o.feedback == "residual")
      run<T, all_reduce<T, C, feedback::residual<float>, S, B>, coll_kind::all_reduce>(o, c, csv);
    else if (o.feedback == "residual_bf16")
      run<T, all_reduce<T, C, feedback::residual<__nv_bfloat16>, S, B>, coll_kind::all_reduce>(o, c,
                                                                                               csv);
    else if (o.feedback == "ef21")
      run<T, all_reduce<T, C, feedback::ef21<float>, S, B>, coll_kind::all_reduce>(o, c, csv);
    else
      known = false;
  });
  return scheduled && known;
}

}  // namespace lowbit_perf
