// lowbit-plan: chooses per-op precisions per device and per-bucket communication bits
// for a model on a cluster, and compares the plan with uniform-precision baselines.
//
// Exit codes: 0 a plan was written, 2 bad input (the message names the place), 1 any
// other failure.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "lowbit/qsync/qsync.hpp"

namespace {

using namespace lowbit::qsync;

constexpr const char* usage = R"(usage: lowbit-plan [options]

Plans mixed precision for data-parallel training on a (hybrid) cluster: a precision
for every operator on every device type and a bit-width for every gradient bucket,
minimising QSync's perturbation indicator under an iteration-time target and each
device's memory.

options:
  --model NAME|FILE     resnet50 (default), bert-base, or a model JSON file
  --cluster NAME|FILE   t4v100 (default: 4x T4 + 4x V100, 25 Gb/s Ethernet),
                        h200x2 (2x H200, NVLink), a device name alone (H200: one
                        GPU), or a cluster JSON file
  --traces LIST         profiles of the cluster's one device group, one per precision:
                        fp32=a.json,bf16=b.json (PyTorch-profiler traces with a
                        range per op); op times, host times and the iteration's tail
  --plain-traces LIST   un-instrumented traces of the same loops, fp32=a0.json,...:
                        their host time per iteration corrects the ranges' overhead
  --plan FILE           predict this plan instead of choosing one (plan JSON as
                        --out writes it, or {"default": "bf16", "ops": {...}})
  --json FILE           write predicted time and memory per device as JSON
  --timeline FILE       with --plan: where the prediction's time goes, as CSV, one row
                        per replayed kernel of the first device group (op, kind, host
                        ms, GPU ms, when the host has issued it, its start and end on
                        the GPU), then the tail's row
  --switch-costs FILE   what a precision switch costs on every group's device, as
                        switch_probe.py measures it (its "device" object: cast fits,
                        cast_host_ms, cast_backward_host_ms, wrap_host_ms,
                        wrap_backward_host_ms, function_call_host_ms)
  --batch N             per-GPU batch of a built-in model (resnet50: 32, bert-base: 8)
  --seq N               sequence length of bert-base (default 384)
  --target-ms X         iteration-time target; default: the fastest device type's
                        full-precision compute time, or the fastest uniform plan's
                        time if that is slower
  --target-slack PCT    target: the fastest uniform plan's predicted time plus PCT
                        percent (e.g. 5: the most ops at high precision within 5% of
                        the fastest plan); --target-ms wins when both are given
  --target-speedup PCT  target: keep PCT percent of the fastest uniform plan's speed-up
                        over uniform --speedup-over (default bf16): e.g. 80 on Hopper
                        with fp8 in the menu, the fewest, least sensitive fp8 ops that
                        keep 80% of uniform fp8's speed-up over bf16
  --comm-bits LIST      candidate bucket bit-widths, ascending (default 4,8,16,32;
                        16 = bf16, 32 = fp32)
  --solver greedy|exact greedy (default) or the exact branch and bound (small models)
  --ranks-per-node G    reduce buckets hierarchically: nodes of G ranks (the cluster's
                        link inside a node, --inter-link between nodes)
  --inter-link NAME     a built-in link, per rank, between nodes (default ib-ndr)
  --schedule NAME       the hierarchical all-reduce's Schedule, as lowbit-perf names
                        them: default (ramped<8, 2^24>), flat, pipelined, pipelined2,
                        pipelined4, pipelined8, pipelined16, ramped23; it sets the
                        chunks a call is cut into
  --backend nccl|mpi    the hierarchical all-reduce's backend (default nccl): NCCL
                        overlaps the stages of different chunks, MPI runs them in turn
  --comm-calibration FILE[:REGIME]
                        bucket all-reduce times measured on the cluster's own links:
                        lowbit-perf --csv rows (coll all_reduce, --comm-feedback) of the
                        regime REGIME (needed when FILE holds several), interpolated in
                        log(bytes); coded widths from float rows' lowbit_us, 32 from
                        float rows' nccl_us, 16 from bfloat16 rows' nccl_us plus the
                        casts. A size outside the measured range, a width or a rank
                        count the table lacks, and hierarchical all-reduces stay with
                        the analytic model; the output counts them
  --comm-feedback NAME  the rows of --comm-calibration measured with this feedback
                        (lowbit-perf's --feedback: none (default), residual, ...): the
                        one the trainer runs, whose state traffic the time includes
  --comm-table COUNT    print the communication model instead of planning: predicted
                        ms of one all-reduce of COUNT fp32 values per --comm-bits width
                        on each of --nodes (default 2,4,8,16) nodes of G ranks (the
                        device of the cluster's first group, --intra-link inside a
                        node), and the speed-up over fp32
  --nodes LIST          node counts of --comm-table
  --csv FILE            write --comm-table's rows as CSV too (what scripts/multinode-docs
                        turns into docs/multi-node.md's table)
  --intra-link NAME     the link inside a node for --comm-table (default nvlink4)
  --out FILE            write the plan as JSON
  --all-ops             list parameter-free ops too (they follow their input)
  --help                this text

exit status: 0 plan written, 2 bad input (unknown op, cycle, infeasible memory,
malformed JSON, bad option), 1 other errors.
)";

// A command-line mistake: reported like bad input (exit 2) with the usage hint.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct options {
  std::string model = "resnet50", cluster_name = "t4v100", out, solver = "greedy";
  std::string traces, plain_traces, plan_file, json_out, switch_costs, timeline;
  int batch = 0, seq = 384;
  double target_ms = 0;
  double target_slack = -1;    // percent over the fastest uniform plan; < 0: not given
  double target_speedup = -1;  // percent of the fastest plan's speed-up over the reference
  std::string speedup_over = "bf16";
  std::vector<int> comm_bits = {4, 8, 16, 32};
  int ranks_per_node = 0;
  std::string inter_link = "ib-ndr", intra_link = "nvlink4";
  comm_schedule schedule;
  comm_backend backend = comm_backend::nccl;
  bool given_schedule = false, given_backend = false;  // else the cluster's (JSON) apply
  std::string csv, comm_calibration, comm_feedback = "none";
  double comm_table = 0;
  std::vector<int> nodes = {2, 4, 8, 16};
  bool all_ops = false, help = false;
};

double to_number(const std::string& flag, const std::string& text) {
  try {
    std::size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw usage_error(flag + ": expected a number, got '" + text + "'");
}

options parse_args(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      o.help = true;
    } else if (a == "--model") {
      o.model = value();
    } else if (a == "--cluster") {
      o.cluster_name = value();
    } else if (a == "--batch") {
      o.batch = static_cast<int>(to_number(a, value()));
    } else if (a == "--seq") {
      o.seq = static_cast<int>(to_number(a, value()));
    } else if (a == "--target-ms") {
      o.target_ms = to_number(a, value());
      if (!(o.target_ms > 0)) throw usage_error("--target-ms must be positive");
    } else if (a == "--target-speedup") {
      o.target_speedup = to_number(a, value());
      if (!(o.target_speedup >= 0 && o.target_speedup <= 100))
        throw usage_error("--target-speedup must lie in [0, 100] (percent)");
    } else if (a == "--speedup-over") {
      o.speedup_over = value();
    } else if (a == "--target-slack") {
      o.target_slack = to_number(a, value());
      if (!(o.target_slack >= 0)) throw usage_error("--target-slack must be >= 0 (percent)");
    } else if (a == "--comm-bits") {
      o.comm_bits.clear();
      std::stringstream ss(value());
      for (std::string item; std::getline(ss, item, ',');)
        o.comm_bits.push_back(static_cast<int>(to_number(a, item)));
    } else if (a == "--solver") {
      o.solver = value();
      if (o.solver != "greedy" && o.solver != "exact")
        throw usage_error("--solver must be greedy or exact, got '" + o.solver + "'");
    } else if (a == "--ranks-per-node") {
      o.ranks_per_node = static_cast<int>(to_number(a, value()));
      if (o.ranks_per_node < 1) throw usage_error("--ranks-per-node must be >= 1");
    } else if (a == "--inter-link") {
      o.inter_link = value();
    } else if (a == "--intra-link") {
      o.intra_link = value();
    } else if (a == "--schedule") {
      try {
        o.schedule = builtin_schedule(value());
        o.given_schedule = true;
      } catch (const lowbit::invalid_argument& e) {
        throw usage_error("--schedule: " + e.message());
      }
    } else if (a == "--backend") {
      const std::string b = value();
      if (b != "nccl" && b != "mpi")
        throw usage_error("--backend must be nccl or mpi, got '" + b + "'");
      o.backend = parse_comm_backend(b);
      o.given_backend = true;
    } else if (a == "--comm-calibration") {
      o.comm_calibration = value();
    } else if (a == "--comm-feedback") {
      o.comm_feedback = value();
    } else if (a == "--csv") {
      o.csv = value();
    } else if (a == "--comm-table") {
      o.comm_table = to_number(a, value());
      if (!(o.comm_table > 0)) throw usage_error("--comm-table needs a positive count");
    } else if (a == "--nodes") {
      o.nodes.clear();
      std::stringstream ss(value());
      for (std::string item; std::getline(ss, item, ',');)
        o.nodes.push_back(static_cast<int>(to_number(a, item)));
    } else if (a == "--out") {
      o.out = value();
    } else if (a == "--traces") {
      o.traces = value();
    } else if (a == "--plain-traces") {
      o.plain_traces = value();
    } else if (a == "--plan") {
      o.plan_file = value();
    } else if (a == "--json") {
      o.json_out = value();
    } else if (a == "--timeline") {
      o.timeline = value();
    } else if (a == "--switch-costs") {
      o.switch_costs = value();
    } else if (a == "--all-ops") {
      o.all_ops = true;
    } else {
      throw usage_error("unknown option '" + a + "'");
    }
  }
  if (!o.timeline.empty() && o.plan_file.empty())
    throw usage_error("--timeline writes the replay of a given plan: it needs --plan");
  return o;
}

bool is_json_file(const std::string& s) {
  return s.size() > 5 && s.compare(s.size() - 5, 5, ".json") == 0;
}

std::string dir_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

training_model load_model(const options& o) {
  if (is_json_file(o.model)) return model_from_json(read_json_file(o.model));
  if (o.model == "resnet50") return resnet50(o.batch > 0 ? o.batch : 32);
  if (o.model == "bert-base") return bert_base(o.batch > 0 ? o.batch : 8, o.seq);
  return builtin_model(o.model);  // throws, listing the built-ins
}

constexpr double gib = 1024.0 * 1024.0 * 1024.0;

cluster load_cluster(const options& o, const op_graph& g) {
  cluster c = is_json_file(o.cluster_name)
                  ? cluster_from_json(read_json_file(o.cluster_name), g, dir_of(o.cluster_name))
                  : builtin_cluster(o.cluster_name);
  if (!o.switch_costs.empty()) {
    const nlohmann::json j = read_json_file(o.switch_costs);
    detail::at_place(o.switch_costs, [&] {
      for (auto& grp : c.groups) apply_device_fields(grp.device, j.value("device", j));
    });
  }
  if (!o.plain_traces.empty() && o.traces.empty())
    throw usage_error("--plain-traces needs --traces");
  if (o.traces.empty()) return c;
  if (c.groups.size() != 1)
    throw usage_error("--traces profiles one device group; cluster '" + c.name + "' has " +
                      std::to_string(c.groups.size()) + " (give each group's \"trace\" list in " +
                      "the cluster JSON)");
  std::vector<profile_files> profiles = parse_profile_list(o.traces);
  if (!o.plain_traces.empty()) add_plain_traces(profiles, o.plain_traces);
  load_profiles(c.groups[0].measured, profiles, g, "");
  return c;
}

// --comm-calibration FILE[:REGIME]: the table, its regime after the last ':' unless what
// follows holds a '/' (then the whole is a path).
std::shared_ptr<const comm_calibration> load_calibration(const std::string& spec,
                                                         const std::string& feedback) {
  const auto colon = spec.rfind(':');
  calibration_filter f;
  f.feedback = feedback;
  std::string file = spec;
  if (colon != std::string::npos && spec.find('/', colon) == std::string::npos) {
    file = spec.substr(0, colon);
    f.regime = spec.substr(colon + 1);
    if (file.empty() || f.regime.empty())
      throw usage_error("--comm-calibration: expected FILE[:REGIME], got '" + spec + "'");
  }
  return std::make_shared<const comm_calibration>(load_comm_calibration(file, f));
}

// Where a plan's bucket times come from: buckets the table answers, buckets the model
// prices for lack of a measurement, and the reasons.
struct bucket_sources {
  std::size_t from_table = 0, fallback = 0;
  std::set<std::string> reasons;
};

bucket_sources sources_of(const simulator& sim, const std::vector<int>& bits) {
  bucket_sources s;
  const cluster& hw = sim.hardware();
  if (!hw.calibration || hw.hierarchical() || hw.world_size() == 1) return s;
  for (std::size_t k = 0; k < sim.buckets().size(); ++k) {
    std::string why;
    if (hw.calibration->measured_ms(bits[k], sim.buckets()[k].numel, hw.world_size(), why) >= 0) {
      ++s.from_table;
    } else {
      ++s.fallback;
      s.reasons.insert(why);
    }
  }
  return s;
}

// Where the bucket all-reduce times came from, as JSON: "model" or "table" with its file,
// regime and lookup counts.
nlohmann::ordered_json comm_times_json(const simulator& sim) {
  nlohmann::ordered_json j;
  const cluster& hw = sim.hardware();
  const bool table = hw.calibration && !hw.hierarchical();
  j["source"] = table ? "table" : "model";
  if (hw.calibration) {
    j["table"] = hw.calibration->file();
    j["regime"] = hw.calibration->regime();
    j["lookups"] = hw.calibration->lookups();
    j["fallbacks"] = hw.calibration->fallbacks();
  }
  return j;
}

// Prints the line saying how many of a plan's buckets the table priced.
void print_sources(const simulator& sim, const std::vector<int>& bits) {
  const cluster& hw = sim.hardware();
  if (!hw.calibration || hw.hierarchical() || hw.world_size() == 1) return;
  const bucket_sources s = sources_of(sim, bits);
  std::printf("  bucket times: %zu of %zu from %s (%s), %zu from the analytic model%s\n",
              s.from_table, sim.buckets().size(), hw.calibration->file().c_str(),
              hw.calibration->regime().c_str(), s.fallback, s.reasons.empty() ? "" : ":");
  for (const auto& r : s.reasons) std::printf("    %s\n", r.c_str());
  std::printf("  table lookups while planning: %zu, %zu of them fell back to the analytic model",
              hw.calibration->lookups(), hw.calibration->fallbacks());
  std::string by_bits;
  for (int b = 1; b <= 32; ++b)
    if (hw.calibration->fallbacks(b) > 0)
      by_bits += (by_bits.empty() ? "" : ", ") + std::to_string(b) + "-bit " +
                 std::to_string(hw.calibration->fallbacks(b));
  std::printf("%s%s%s\n", by_bits.empty() ? "" : " (", by_bits.c_str(), by_bits.empty() ? "" : ")");
}

// Writes `{"model", "cluster", "comm_times", "plans": [...]}` to `path`; `bits` are each
// plan's bucket bit-widths.
void write_predictions(const std::string& path, const simulator& sim,
                       const std::vector<std::pair<std::string, evaluation>>& plans,
                       const std::vector<std::vector<int>>& bits) {
  nlohmann::ordered_json j;
  j["model"] = sim.model().name;
  j["cluster"] = sim.hardware().name;
  j["comm_times"] = comm_times_json(sim);
  j["plans"] = nlohmann::ordered_json::array();
  for (std::size_t p = 0; p < plans.size(); ++p) {
    nlohmann::ordered_json pj = evaluation_to_json(sim, plans[p].first, plans[p].second);
    if (j["comm_times"]["source"] == "table") {
      const bucket_sources s = sources_of(sim, bits[p]);
      pj["comm_buckets"] = {{"from_table", s.from_table}, {"fallback", s.fallback}};
    }
    j["plans"].push_back(std::move(pj));
  }
  std::ofstream out(path);
  if (!out) throw usage_error("cannot write '" + path + "'");
  out << j.dump(2) << "\n";
  std::printf("  predictions written to %s\n", path.c_str());
}

// Writes group 0's replayed kernels of `e` as CSV (--timeline): each kernel's op and kind,
// host and GPU time, when the host has issued it and when it runs on the compute stream;
// a last row for the tail (the optimizer step and whatever no op launched).
void write_timeline(const std::string& path, const simulator& sim, const evaluation& e) {
  static const char* const kinds[] = {"forward", "backward", "cast", "optimizer", "code"};
  const group_result& g = e.groups.at(0);
  const stream_times t = replay_streams(g.trace.kernels);
  std::ofstream out(path);
  if (!out) throw usage_error("cannot write '" + path + "'");
  out << "index,op,kind,cpu_ms,gpu_ms,issued_ms,start_ms,end_ms\n";
  double issued = 0.0;
  char line[128];
  for (std::size_t i = 0; i < g.trace.kernels.size(); ++i) {
    const kernel& k = g.trace.kernels[i];
    issued += k.cpu_ms;
    std::snprintf(line, sizeof line, ",%s,%.6f,%.6f,%.6f,%.6f,%.6f\n",
                  kinds[static_cast<int>(k.kind)], k.cpu_ms, k.gpu_ms, issued, t.start[i],
                  t.end[i]);
    out << i << "," << (k.op == no_index ? std::string() : sim.graph().at(k.op).name) << line;
  }
  const double end = std::max(t.compute_end, t.cpu_end);
  std::snprintf(line, sizeof line, ",tail,%.6f,%.6f,%.6f,%.6f,%.6f\n", g.trace.tail_cpu_ms,
                g.trace.tail_ms, t.cpu_end + g.trace.tail_cpu_ms, end, end + g.trace.tail_ms);
  out << g.trace.kernels.size() << "," << line;
  std::printf("  timeline written to %s\n", path.c_str());
}

// --plan: predicts the given plan and prints its time and memory per device group.
int predict_given(const options& o, const simulator& sim) {
  const plan pl = plan_from_json(sim, read_json_file(o.plan_file));
  const evaluation e = sim.evaluate(pl);
  std::printf("  plan %s: %.3f ms per iteration\n", o.plan_file.c_str(), e.iteration_ms());
  print_sources(sim, pl.bucket_bits);
  for (std::size_t g = 0; g < sim.group_count(); ++g) {
    const memory_breakdown& m = e.groups[g].memory;
    std::printf(
        "  %-8s %9.3f ms  %7.3f GiB (weights %.3f, gradients %.3f, optimizer %.3f, activations "
        "%.3f, weight copies %.3f, cast copies %.3f, workspace %.3f, not live at the peak "
        "%.3f)%s\n",
        sim.hardware().groups[g].device.name.c_str(), e.times.device_ms[g], m.total() / gib,
        m.weights / gib, m.gradients / gib, m.optimizer / gib, m.activations / gib,
        m.weight_copies / gib, m.cast_copies / gib, m.workspace / gib, m.released / gib,
        e.groups[g].fits ? "" : " (does not fit)");
  }
  if (!o.json_out.empty()) write_predictions(o.json_out, sim, {{o.plan_file, e}}, {pl.bucket_bits});
  if (!o.timeline.empty()) write_timeline(o.timeline, sim, e);
  return 0;
}

void print_row(const simulator& sim, const std::string& label, const evaluation& e) {
  std::printf("  %-34s %10.2f", label.c_str(), e.iteration_ms());
  for (std::size_t g = 0; g < sim.group_count(); ++g)
    std::printf(" %9.2f%s", e.groups[g].memory.total() / gib, e.groups[g].fits ? " " : "!");
  std::printf("\n");
}

/// --comm-table: the communication model alone, for node counts x code widths: the time of
/// the configured backend (NCCL: chunks overlapped), the sum of the stages beside it (the MPI
/// time, an upper bound on NCCL) and the speed-up over fp32, optionally as CSV for the docs.
int comm_table(const options& o, const device_profile& dev) {
  const int G = o.ranks_per_node > 0 ? o.ranks_per_node : 8;
  const link_profile intra = builtin_link(o.intra_link), inter = builtin_link(o.inter_link);
  std::printf(
      "lowbit-plan: hierarchical all-reduce of %.0f fp32 values, nodes of %d %s, %s "
      "inside (%.3g GB/s), %s per rank between nodes (%.3g GB/s), schedule %s, backend %s\n",
      o.comm_table, G, dev.name.c_str(), intra.name.c_str(), intra.bandwidth_gbs,
      inter.name.c_str(), inter.bandwidth_gbs, o.schedule.name.c_str(), to_string(o.backend));
  std::printf("  %6s %6s %6s %12s %12s %12s %10s\n", "nodes", "bits", "chunks", "ms", "sum ms",
              "fp32 ms", "speed-up");
  std::FILE* csv = nullptr;
  if (!o.csv.empty()) {
    csv = std::fopen(o.csv.c_str(), "w");
    if (csv == nullptr) throw usage_error("cannot write '" + o.csv + "'");
    std::fprintf(csv,
                 "device,intra_link,inter_link,nodes,ranks_per_node,count,schedule,backend,bits,"
                 "chunks,ms,sum_ms,fp32_ms,fp32_sum_ms,speedup\n");
  }
  const auto time = [&](int bits, int n) {
    const hierarchical_stages st =
        hierarchical_stage_ms(bits, o.comm_table, n, G, intra, inter, dev, 32, o.schedule);
    return std::make_pair(o.backend == comm_backend::nccl ? st.pipelined_ms() : st.sum_ms(), st);
  };
  for (int n : o.nodes) {
    if (n < 1) throw usage_error("--nodes: node counts must be >= 1");
    const auto [fp32, fp32_st] = time(32, n);
    for (int bits : o.comm_bits) {
      const auto [ms, st] = time(bits, n);
      const double speedup = ms > 0 ? fp32 / ms : 1.0;
      std::printf("  %6d %6d %6d %12.3f %12.3f %12.3f %9.2fx\n", n, bits, st.chunks(), ms,
                  st.sum_ms(), fp32, speedup);
      if (csv)
        std::fprintf(csv, "%s,%s,%s,%d,%d,%.0f,%s,%s,%d,%d,%.3f,%.3f,%.3f,%.3f,%.2f\n",
                     dev.name.c_str(), intra.name.c_str(), inter.name.c_str(), n, G, o.comm_table,
                     o.schedule.name.c_str(), to_string(o.backend), bits, st.chunks(), ms,
                     st.sum_ms(), fp32, fp32_st.sum_ms(), speedup);
    }
  }
  if (csv) {
    std::fclose(csv);
    std::printf("  rows written to %s\n", o.csv.c_str());
  }
  return 0;
}

int run(const options& o) {
  const training_model model = load_model(o);
  cluster hw = load_cluster(o, model.graph);
  if (o.given_schedule) hw.schedule = o.schedule;
  if (o.given_backend) hw.backend = o.backend;
  if (o.comm_table > 0) {
    if (!o.comm_calibration.empty())
      throw usage_error(
          "--comm-calibration prices the planner's flat bucket all-reduces; --comm-table "
          "prints the analytic hierarchical model");
    options t = o;
    t.schedule = hw.schedule;
    t.backend = hw.backend;
    return comm_table(t, hw.groups.at(0).device);
  }
  if (o.ranks_per_node > 0) {
    if (hw.world_size() % o.ranks_per_node != 0)
      throw usage_error("--ranks-per-node " + std::to_string(o.ranks_per_node) +
                        " does not divide the cluster's " + std::to_string(hw.world_size()) +
                        " ranks");
    hw.ranks_per_node = o.ranks_per_node;
    hw.inter_link = builtin_link(o.inter_link);
  }
  if (!o.comm_calibration.empty())
    hw.calibration = load_calibration(o.comm_calibration, o.comm_feedback);
  const simulator sim(model, hw);
  const op_graph& g = sim.graph();

  std::size_t decisions = 0;
  for (const auto& op : g.ops()) decisions += op.has_params() ? 1 : 0;
  std::string devices;
  for (const auto& grp : hw.groups)
    devices += (devices.empty() ? "" : " + ") + std::to_string(grp.count) + "x " + grp.device.name;
  std::printf("lowbit-plan: %s on %s (%s over %s, %.3g GB/s)\n", model.name.c_str(),
              hw.name.c_str(), devices.c_str(), hw.link.name.c_str(), hw.link.bandwidth_gbs);
  if (hw.hierarchical())
    std::printf(
        "  hierarchical all-reduce: %d nodes of %d ranks, %s between nodes (%.3g GB/s "
        "per rank), schedule %s on %s (%s); bucket bits are the cross-node width\n",
        hw.world_size() / hw.ranks_per_node, hw.ranks_per_node, hw.inter_link.name.c_str(),
        hw.inter_link.bandwidth_gbs, hw.schedule.name.c_str(), to_string(hw.backend),
        hw.backend == comm_backend::nccl ? "chunks overlapped" : "chunks in turn");
  if (hw.calibration && hw.hierarchical())
    std::printf(
        "  bucket times: the analytic hierarchical model; %s (%s) prices flat all-reduces "
        "only\n",
        hw.calibration->file().c_str(), hw.calibration->regime().c_str());
  else if (hw.calibration)
    std::printf(
        "  bucket times: measured all-reduces from %s (regime %s, %zu series), the analytic "
        "model where it has none\n",
        hw.calibration->file().c_str(), hw.calibration->regime().c_str(),
        hw.calibration->series_count());
  std::printf("  %zu ops (%zu with parameters), %.1fM parameters, %zu gradient buckets\n", g.size(),
              decisions, g.total_params() / 1e6, sim.buckets().size());
  if (!o.plan_file.empty()) return predict_given(o, sim);

  const double target = o.target_ms > 0 ? o.target_ms
                        : o.target_slack >= 0
                            ? slack_target_ms(sim, o.comm_bits.front(), o.target_slack / 100.0)
                        : o.target_speedup >= 0
                            ? speedup_target_ms(sim, o.comm_bits.front(), o.target_speedup / 100.0,
                                                parse_precision(o.speedup_over))
                            : default_target_ms(sim, o.comm_bits);
  const allocation_problem pb(sim, indicator_scores(sim, o.comm_bits), o.comm_bits, target);
  const allocation a = o.solver == "exact" ? exact_allocate(pb) : greedy_allocate(pb);
  char slack[96] = "";
  if (o.target_ms <= 0 && o.target_slack >= 0)
    std::snprintf(slack, sizeof slack, " (fastest uniform plan + %g%%)", o.target_slack);
  else if (o.target_ms <= 0 && o.target_speedup >= 0)
    std::snprintf(slack, sizeof slack, " (%g%% of the fastest plan's speed-up over uniform %s)",
                  o.target_speedup, o.speedup_over.c_str());
  std::printf("  target %.2f ms%s, %s solver, %zu plans predicted\n\n", target,
              o.target_ms > 0 ? "" : (slack[0] ? slack : " (default)"), o.solver.c_str(),
              a.evaluations);

  std::printf("  %-34s %10s", "plan", "iter ms");
  for (const auto& grp : hw.groups) std::printf(" %9s", (grp.device.name + " GiB").c_str());
  std::printf("\n");
  const int low = o.comm_bits.front();
  std::vector<std::pair<std::string, evaluation>> rows = {
      {"uniform fp32, fp32 buckets", sim.evaluate(sim.uniform(precision::fp32, 32))},
      {"uniform fp16, fp32 buckets", sim.evaluate(sim.uniform(precision::fp16, 32))}};
  bool bf16 = false;
  for (const auto& grp : hw.groups)
    bf16 = bf16 || std::find(grp.device.precisions.begin(), grp.device.precisions.end(),
                             precision::bf16) != grp.device.precisions.end();
  if (bf16)
    rows.push_back({"uniform bf16, fp32 buckets", sim.evaluate(sim.uniform(precision::bf16, 32))});
  rows.push_back({"uniform lowest, fp32 buckets", sim.evaluate(sim.uniform(precision::int8, 32))});
  rows.push_back({"uniform lowest, " + std::to_string(low) + "-bit buckets",
                  sim.evaluate(sim.uniform(precision::int8, low))});
  rows.push_back({std::string("lowbit plan (") + o.solver + ")", a.eval});
  for (const auto& [label, e] : rows) print_row(sim, label, e);
  std::printf("  usable memory:%32s", "");
  for (const auto& grp : hw.groups) std::printf(" %9.2f ", grp.device.usable_bytes() / gib);
  std::printf("\n");
  if (!a.target_met)
    std::printf("\n  warning: no plan meets %.2f ms; this is the fastest uniform plan\n", target);

  std::printf("\n  buckets (all-reduce in this order):\n  %4s %12s %5s %10s %10s\n", "#",
              "gradients", "bits", "start ms", "end ms");
  for (std::size_t k = 0; k < sim.buckets().size(); ++k)
    std::printf("  %4zu %12.0f %5d %10.2f %10.2f\n", k, sim.buckets()[k].numel,
                a.result.bucket_bits[k], a.eval.times.bucket_start[k], a.eval.times.bucket_end[k]);
  print_sources(sim, a.result.bucket_bits);

  std::printf("\n  precision per op and device type%s:\n  %-36s",
              o.all_ops ? "" : " (ops with parameters)", "op");
  for (const auto& grp : hw.groups) std::printf(" %6s", grp.device.name.c_str());
  std::printf("\n");
  std::vector<std::map<std::string, int>> counts(hw.groups.size());
  for (std::size_t i : g.topo_order()) {
    for (std::size_t gr = 0; gr < hw.groups.size(); ++gr)
      if (g.at(i).has_params()) ++counts[gr][to_string(a.result.precisions[gr][i])];
    if (!o.all_ops && !g.at(i).has_params()) continue;
    std::printf("  %-36s", g.at(i).name.c_str());
    for (std::size_t gr = 0; gr < hw.groups.size(); ++gr)
      std::printf(" %6s", to_string(a.result.precisions[gr][i]));
    std::printf("\n");
  }
  std::printf("\n  summary:");
  for (std::size_t gr = 0; gr < hw.groups.size(); ++gr) {
    std::printf(" %s", hw.groups[gr].device.name.c_str());
    for (const auto& [p, n] : counts[gr]) std::printf(" %s=%d", p.c_str(), n);
    std::printf(gr + 1 < hw.groups.size() ? ";" : "\n");
  }
  if (!o.out.empty()) {
    std::ofstream out(o.out);
    if (!out) throw usage_error("cannot write '" + o.out + "'");
    out << plan_to_json(sim, a).dump(2) << "\n";
    std::printf("  plan written to %s\n", o.out.c_str());
  }
  if (!o.json_out.empty()) {
    const std::size_t n = sim.buckets().size();
    std::vector<std::vector<int>> bits = {std::vector<int>(n, 32), std::vector<int>(n, 32)};
    if (bf16) bits.emplace_back(n, 32);
    bits.emplace_back(n, 32);
    bits.emplace_back(n, low);
    bits.push_back(a.result.bucket_bits);
    write_predictions(o.json_out, sim, rows, bits);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse_args(argc, argv);
    if (o.help) {
      std::fputs(usage, stdout);
      return 0;
    }
    return run(o);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "lowbit-plan: %s\n(try --help)\n", e.what());
    return 2;
  } catch (const lowbit::invalid_argument& e) {
    std::fprintf(stderr, "lowbit-plan: bad input: %s\n", e.message().c_str());
    return 2;
  } catch (const nlohmann::json::exception& e) {
    std::fprintf(stderr, "lowbit-plan: bad input: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lowbit-plan: error: %s\n", e.what());
    return 1;
  }
}
