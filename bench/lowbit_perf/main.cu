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
//
// --backend node runs lowbit's collectives on the node backend (CUDA IPC, no NCCL) instead,
// with NCCL's figures beside them still. Its ranks may share a GPU, where NCCL cannot run:
// then the NCCL columns stay empty, the references go through MPI, and the output says that
// its timings are not speed-ups (the ranks time-slice one GPU and share its HBM).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <lowbit/collective/nccl.cuh>
#include <lowbit/comm/mpi_bootstrap.hpp>
#include <lowbit/comm/node_mpi.hpp>
#include <lowbit/lowbit.cuh>

#include "compiled_instances.hpp"
#include "perf.hpp"

namespace lowbit_perf {
namespace {

[[noreturn]] void usage(int code) {
  std::printf(
      "lowbit-perf: lowbit collectives beside NCCL (run under mpirun, one rank per GPU)\n"
      "  --backend <b>           nccl | node (CUDA IPC, no NCCL; ranks may share a GPU,\n"
      "                          then without NCCL's columns) [nccl]\n"
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
      "  --peer-store-ctas <n>   CTAs of the peer-store kernel, 1..1024\n"
      "  Under --backend node, --crossover, --breakdown, --ranks-per-node, --transport other\n"
      "  than automatic | peer_stores and the --copy-engine / --peer-store options are\n"
      "  refused (NCCL's only); NCCL_* link-regime variables change NCCL's columns only.\n");
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
    else if (a == "--backend")
      o.backend = next();
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
      !transport_ok || !lowbit::transport::valid(o.policy) ||
      (o.backend != "nccl" && o.backend != "node")) {
    std::fprintf(stderr,
                 "lowbit-perf: need 0 < -b <= -e, -f > 1, -n >= 1, -w >= 0, --algo "
                 "automatic|two_phase|one_shot, --transport automatic|nccl|nccl_symmetric|"
                 "peer_stores|copy_engines, --peer-store-ctas 1..1024, --backend nccl|node\n");
    std::exit(2);
  }
  if (o.backend == "node") {
    // What only the NCCL backend has: its crossover to plain NCCL, its transports and their
    // policy, the hierarchical all-reduce and the breakdown (NCCL transfers).
    std::string refused;
    const auto refuse = [&](bool given, const char* what) {
      if (given) refused += std::string(refused.empty() ? "" : ", ") + what;
    };
    refuse(o.crossover != "0", "--crossover (no plain path)");
    refuse(o.transport != lowbit::frame_transport::automatic &&
               o.transport != lowbit::frame_transport::peer_stores,
           "--transport (frames always move by peer stores)");
    refuse(o.policy != lowbit::transport::default_policy(),
           "--copy-engine-min-bytes* / --peer-store-* (NCCL's transport policy)");
    refuse(o.ranks_per_node != 0, "--ranks-per-node (no hierarchical collective)");
    refuse(o.breakdown, "--breakdown (times NCCL transfers)");
    if (!refused.empty()) {
      std::fprintf(stderr, "lowbit-perf: --backend node does not take %s\n", refused.c_str());
      std::exit(2);
    }
  }
  return o;
}

/// dispatch<T, Bits, Backend> where this build compiled it (LOWBIT_PERF_INSTANCES), else an
/// error that says so.
template <class T, int Bits, class Backend>
bool dispatch_compiled(const options& o, const comms& c, std::FILE* csv) {
  if constexpr (compiled<T, Bits, Backend>::value) {
    return dispatch<T, Bits, Backend>(o, c, csv);
  } else {
    throw std::runtime_error("this lowbit-perf was built without type " + o.dtype + " at " +
                             std::to_string(Bits) + " bits on backend " + Backend::name +
                             "; configure with -DLOWBIT_PERF_INSTANCES=all");
  }
}

/// The backend --backend names: the one place where it is chosen.
template <class T, int Bits>
bool dispatch_backend(const options& o, const comms& c, std::FILE* csv) {
  return o.backend == "node" ? dispatch_compiled<T, Bits, lowbit::backend::node>(o, c, csv)
                             : dispatch_compiled<T, Bits, lowbit::backend::nccl>(o, c, csv);
}

template <class T>
bool dispatch_bits(const options& o, const comms& c, std::FILE* csv) {
  switch (o.bits) {
    case 1:
      return dispatch_backend<T, 1>(o, c, csv);
    case 2:
      return dispatch_backend<T, 2>(o, c, csv);
    case 4:
      return dispatch_backend<T, 4>(o, c, csv);
    case 8:
      return dispatch_backend<T, 8>(o, c, csv);
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
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    comms c;
    c.ranks_per_gpu = lowbit::comm::ranks_per_gpu(MPI_COMM_WORLD);
    const std::string shared = std::to_string(c.ranks_per_gpu) + " ranks share one GPU";
    LOWBIT_EXPECTS(c.ranks_per_gpu == 1 || o.backend == "node",
                   shared +
                       ", which NCCL refuses (\"Duplicate GPU detected\"): run one rank "
                       "per GPU, or --backend node");
    LOWBIT_EXPECTS(c.ranks_per_gpu == 1 || o.csv.empty(),
                   "--csv: " + shared +
                       ", where timings are not speed-ups and NCCL's "
                       "baseline is unavailable; no CSV rows are written");
    std::unique_ptr<lowbit::comm::nccl_comm> nccl;
    std::unique_ptr<lowbit::comm::node_comm> node;
    if (c.ranks_per_gpu == 1)
      nccl = std::make_unique<lowbit::comm::nccl_comm>(
          lowbit::comm::nccl_comm_from_mpi(MPI_COMM_WORLD));
    if (o.backend == "node")
      node = std::make_unique<lowbit::comm::node_comm>(
          lowbit::comm::node_comm_from_mpi(MPI_COMM_WORLD));
    c.nccl = nccl.get();
    c.node = node.get();
    if (rank == 0 && node)
      for (const char* v : {"NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"})
        if (std::getenv(v))
          std::printf("# %s is set: it changes NCCL's columns only, not the node backend\n", v);
    std::FILE* csv = nullptr;
    if (!o.csv.empty() && rank == 0) {
      csv = std::fopen(o.csv.c_str(), "a");
      if (!csv) throw std::runtime_error("cannot open " + o.csv);
      std::fprintf(csv,
                   "regime,coll,type,op,bits,feedback,schedule,ranks,bytes,count,lowbit_us,"
                   "lowbit_busbw,nccl_us,nccl_busbw,speedup,wire_ratio,rel_err,wrong,"
                   "algorithm,transport,backend\n");
    }
    bool ok = false;
    if (o.dtype == "float")
      ok = dispatch_bits<float>(o, c, csv);
    else if (o.dtype == "half")
      ok = dispatch_bits<__half>(o, c, csv);
    else if (o.dtype == "bfloat16")
      ok = dispatch_bits<__nv_bfloat16>(o, c, csv);
    if (csv) std::fclose(csv);
    if (!ok) {
      if (rank == 0)
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
