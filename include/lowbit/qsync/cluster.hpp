// What is trained (a model: op graph plus training options) and where (a cluster:
// groups of identical devices joined by one link class).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lowbit/qsync/comm_calibration.hpp"
#include "lowbit/qsync/comm_model.hpp"
#include "lowbit/qsync/cost_model.hpp"
#include "lowbit/qsync/device_profile.hpp"
#include "lowbit/qsync/op_graph.hpp"

namespace lowbit::qsync {

/// A model to plan for: its iteration's ops and how DDP trains it.
/// Where a mixed plan's casts go, which depends on what applies the plan.
enum class cast_rule {
  /// One cast per edge whose producer and consumer run at different precisions (QSync's
  /// own plugin casts each op's inputs to its precision).
  per_edge,
  /// Through the step's ambient precision, as lowbit's plan applier
  /// (examples/pytorch/qsync/apply_plan.py) does: an op off the ambient hands the code
  /// between the ops its output cast to the ambient, and an input through that code
  /// (op::via_code) is cast from it. Only 16- and 32-bit float plans (what autocast runs).
  ambient,
};

struct training_model {
  std::string name;
  op_graph graph;
  double optimizer_bytes_per_param = 8.0;  ///< Adam's two fp32 moments; 4 for momentum SGD
  double bucket_cap_mb = 25.0;             ///< DDP bucket_cap_mb
  double first_bucket_mb = 1.0;            ///< DDP's smaller first bucket
  cast_rule casts = cast_rule::per_edge;   ///< model JSON "casts": "per_edge" | "ambient"
  /// Parameters no op takes (a branch the step does not run): their weights' memory
  /// alone, no gradient or optimizer state (model JSON "unused_params": {"numel"}).
  double unused_param_numel = 0.0;
};

/// Identical devices that run the same plan, with their measured op times.
struct device_group {
  device_profile device;
  int count = 1;
  measured_table measured;
};

/// Every device of a synchronous data-parallel job. All ranks join one all-reduce
/// whose speed is set by `link`, the slowest link class any rank crosses; or, with
/// `ranks_per_node` > 1, a hierarchical all-reduce (lowbit::hierarchical_all_reduce) with
/// `link` inside a node and `inter_link` (one rank's own network link) between nodes, the
/// bucket's bits choosing the cross-node code width; `schedule` and `backend` say how that
/// all-reduce cuts and overlaps its chunks (NCCL overlaps them, MPI runs them in turn).
/// With a `calibration` table a flat all-reduce's time is the one measured on `link`'s
/// class (comm_calibration); a hierarchical one stays with the analytic model.
struct cluster {
  std::string name;
  std::vector<device_group> groups;
  link_profile link;
  int ranks_per_node = 0;    ///< 0 or 1: one flat all-reduce over `link`
  link_profile inter_link;   ///< between nodes, per rank, when ranks_per_node > 1
  comm_schedule schedule{};  ///< the hierarchical all-reduce's Schedule (default_schedule)
  comm_backend backend = comm_backend::nccl;            ///< the hierarchical all-reduce's Backend
  std::shared_ptr<const comm_calibration> calibration;  ///< measured flat all-reduces, or none

  /// True when buckets are reduced hierarchically (more than one node of several ranks).
  bool hierarchical() const noexcept { return ranks_per_node > 1 && world_size() > ranks_per_node; }

  /// Total ranks.
  int world_size() const noexcept {
    int n = 0;
    for (const auto& g : groups) n += g.count;
    return n;
  }
};

}  // namespace lowbit::qsync
