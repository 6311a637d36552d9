// lowbit-perf: an nccl-tests-style benchmark of lowbit's collectives beside plain NCCL,
// on the same buffers, in the same run.
//
//   mpirun -np 2 lowbit-perf -b 1M -e 1G -f 2 -d bfloat16 --coll all_reduce --bits 4
//
// One process per GPU (MPI bootstraps NCCL). For each size it times lowbit's collective
// and the NCCL collective of the same type (CUDA events, warm-up, median of -n
// iterations), checks lowbit's output against an fp32 reference (the NCCL collective
// of fp32 copies of the inputs) and, for all_reduce / all_gather, that every rank holds
// bitwise the same output. Sizes S are the uncompressed bytes: algbw = S / t,
// busbw = algbw * 2(n-1)/n for all_reduce and (n-1)/n for reduce_scatter / all_gather,
// as nccl-tests computes them.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <lowbit/collective/nccl.cuh>
#include <lowbit/comm/mpi_bootstrap.hpp>
#include <lowbit/lowbit.cuh>

#include "compiled_instances.hpp"
#include "perf.hpp"

namespace lowbit_perf {
namespace {

[[noreturn]] void usage(int code) {
  std::printf(
      "lowbit-perf: lowbit collectives beside NCCL (run under mpirun, one rank per GPU)\n"
      "  -b, --minbytes <size>   smallest size (K/M/G suffixes)        [1M]\n"
      "  -e, --maxbytes <size>   largest size                          [256M]\n"
      "  -f, --stepfactor <x>    size multiplier between rows          [2]\n"
      "  -n, --iters <n>         timed iterations per size             [20]\n"
      "  -w, --warmup_iters <n>  untimed iterations first              [5]\n"
      "  -c, --check <0|1>       check results                         [1]\n"
      "  -d, --datatype <t>      float | half | bfloat16               [float]\n"
      "  -o, --op <op>           sum | avg                             [sum]\n"
      "  --coll <c>              all_reduce | reduce_scatter | all_gather [all_reduce]\n"
      "  --bits <b>              code width: 1, 2, 4 or 8              [4]\n"
      "  --feedback <f>          none | residual | residual_bf16 | ef21 (all_reduce) [none]\n"
      "  --schedule <s>          default | flat | pipelined | pipelined2/4/8/16 | ramped23\n"
      "                          [default] (all but default and flat: no feedback)\n"
      "  --csv <file>            also append the rows as CSV (rank 0)\n"
      "  --regime <label>        link-regime label for the CSV rows     [default]\n"
      "  --crossover <size|auto> plain NCCL below this size; auto = calibrate_crossover [0]\n"
      "  --algo <a>              all_reduce: automatic | two_phase | one_shot [automatic]\n"
      "  --breakdown             all_reduce: time each pass alone at the largest size\n"
      "  --ranks-per-node <G>    all_reduce: also time the hierarchical all_reduce over\n"
      "                          nodes of G consecutive ranks (hier columns) [0: off]\n"
      "  --transport <t>         automatic | nccl | nccl_symmetric | peer_stores |\n"
      "                          copy_engines [automatic]\n"
      "  --copy-engine-min-bytes <size>  automatic: copy engines for pipelined all-gathers\n"
      "                          of slots this large [transport::default_policy()]\n"
      "  --copy-engine-min-bytes-alone <size>  ... against peer stores or in one chunk\n"
      "  --peer-store-min-bits <b>  automatic: peer stores for codes this wide\n"
      "  --peer-store-ctas <n>   CTAs of the peer-store kernel, 1..1024\n");
  std::exit(code);
}

/// The frame_transport whose name (lowbit::to_string) is `name`; false for none.
bool parse_transport(const std::string& name, lowbit::frame_transport& out) {
  using lowbit::frame_transport;
  for (const auto t : lowbit::all_frame_transports)
    if (name == lowbit::to_string(t)) return out = t, true;
  return false;
}

options parse(int argc, char** argv) {
  options o;
  bool transport_ok = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage(2);
      return argv[++i];
    };
    if (a == "-b" || a == "--minbytes")
      o.min_bytes = parse_size(next());
    else if (a == "-e" || a == "--maxbytes")
      o.max_bytes = parse_size(next());
    else if (a == "-f" || a == "--stepfactor")
      o.factor = std::atof(next());
    else if (a == "-n" || a == "--iters")
      o.iters = std::atoi(next());
    else if (a == "-w" || a == "--warmup_iters")
      o.warmup = std::atoi(next());
    else if (a == "-c" || a == "--check")
      o.check = std::atoi(next());
    else if (a == "-d" || a == "--datatype")
      o.dtype = next();
    else if (a == "-o" || a == "--op")
      o.op = next();
    else if (a == "--coll")
      o.coll = next();
    else if (a == "--bits")
      o.bits = std::atoi(next());
    else if (a == "--feedback")
      o.feedback = next();
    else if (a == "--schedule")
      o.schedule = next();
    else if (a == "--csv")
      o.csv = next();
    else if (a == "--regime")
      o.regime = next();
    else if (a == "--crossover")
      o.crossover = next();
    else if (a == "--algo")
      o.algorithm = next();
    else if (a == "--ranks-per-node")
      o.ranks_per_node = std::atoi(next());
    else if (a == "--breakdown")
      o.breakdown = true;
    else if (a == "--transport")
      transport_ok = parse_transport(next(), o.transport);
    else if (a == "--copy-engine-min-bytes")
      o.policy.copy_engine_min_bytes = parse_size(next());
    else if (a == "--copy-engine-min-bytes-alone")
      o.policy.copy_engine_min_bytes_alone = parse_size(next());
    else if (a == "--peer-store-min-bits")
      o.policy.peer_store_min_bits = std::atoi(next());
    else if (a == "--peer-store-ctas")
      o.policy.peer_store_ctas = std::atoi(next());
    else if (a == "-h" || a == "--help")
      usage(0);
    else {
      std::fprintf(stderr, "lowbit-perf: unknown argument %s\n", a.c_str());
      usage(2);
    }
  }
  if (o.factor <= 1 || o.iters < 1 || o.warmup < 0 || o.min_bytes == 0 ||
      o.max_bytes < o.min_bytes ||
      (o.algorithm != "automatic" && o.algorithm != "two_phase" && o.algorithm != "one_shot") ||
      !transport_ok || !lowbit::transport::valid(o.policy)) {
    std::fprintf(stderr,
                 "lowbit-perf: need 0 < -b <= -e, -f > 1, -n >= 1, -w >= 0, --algo "
                 "automatic|two_phase|one_shot, --transport automatic|nccl|nccl_symmetric|"
                 "peer_stores|copy_engines, --peer-store-ctas 1..1024\n");
    std::exit(2);
  }
  return o;
}

/// dispatch<T, Bits> where this build compiled it (LOWBIT_PERF_INSTANCES), else an error
/// that says so.
template <class T, int Bits>
bool dispatch_compiled(const options& o, lowbit::comm::nccl_comm& comm, std::FILE* csv) {
  if constexpr (compiled<T, Bits>::value) {
    return dispatch<T, Bits>(o, comm, csv);
  } else {
    throw std::runtime_error("this lowbit-perf was built without type " + o.dtype + " at " +
                             std::to_string(Bits) +
                             " bits; configure with -DLOWBIT_PERF_INSTANCES=all");
  }
}

template <class T>
bool dispatch_bits(const options& o, lowbit::comm::nccl_comm& comm, std::FILE* csv) {
  switch (o.bits) {
    case 1:
      return dispatch_compiled<T, 1>(o, comm, csv);
    case 2:
      return dispatch_compiled<T, 2>(o, comm, csv);
    case 4:
      return dispatch_compiled<T, 4>(o, comm, csv);
    case 8:
      return dispatch_compiled<T, 8>(o, comm, csv);
    default:
      return false;
  }
}

}  // namespace
}  // namespace lowbit_perf

using namespace lowbit_perf;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const options o = parse(argc, argv);
  int status = 0;
  try {
    lowbit::comm::select_local_device(MPI_COMM_WORLD);
    lowbit::comm::nccl_comm comm = lowbit::comm::nccl_comm_from_mpi(MPI_COMM_WORLD);
    std::FILE* csv = nullptr;
    if (!o.csv.empty() && comm.rank() == 0) {
      csv = std::fopen(o.csv.c_str(), "a");
      if (!csv) throw std::runtime_error("cannot open " + o.csv);
      std::fprintf(csv,
                   "regime,coll,type,op,bits,feedback,schedule,ranks,bytes,count,lowbit_us,"
                   "lowbit_busbw,nccl_us,nccl_busbw,speedup,wire_ratio,rel_err,wrong,"
                   "algorithm,transport\n");
    }
    bool ok = false;
    if (o.dtype == "float")
      ok = dispatch_bits<float>(o, comm, csv);
    else if (o.dtype == "half")
      ok = dispatch_bits<__half>(o, comm, csv);
    else if (o.dtype == "bfloat16")
      ok = dispatch_bits<__nv_bfloat16>(o, comm, csv);
    if (csv) std::fclose(csv);
    if (!ok) {
      if (comm.rank() == 0)
        std::fprintf(stderr,
                     "lowbit-perf: unsupported combination (type %s, bits %d, coll %s, "
                     "feedback %s, schedule %s); see --help\n",
                     o.dtype.c_str(), o.bits, o.coll.c_str(), o.feedback.c_str(),
                     o.schedule.c_str());
      status = 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lowbit-perf: %s\n", e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
