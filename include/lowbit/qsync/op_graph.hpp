// The operators of one training iteration as a validated DAG. Each op stands for its
// forward kernel; its backward kernel is implied and runs in reverse topological order.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lowbit/core/error.hpp"
#include "lowbit/qsync/precision.hpp"

namespace lowbit::qsync {

/// What an operator computes; it decides the backward cost and the 16-bit floor.
enum class op_kind {
  conv,
  linear,
  matmul,  ///< activation x activation (attention scores); no weights
  embedding,
  layer_norm,
  batch_norm,
  softmax,
  gelu,
  relu,
  pool,
  add,
  loss,
  other
};

namespace detail {
inline constexpr const char* op_kind_names[] = {
    "conv", "linear", "matmul", "embedding", "layer_norm", "batch_norm", "softmax",
    "gelu", "relu",   "pool",   "add",       "loss",       "other"};
}

/// The lowercase name used in JSON ("conv", "layer_norm", ...).
constexpr const char* to_string(op_kind k) noexcept {
  return detail::op_kind_names[static_cast<int>(k)];
}

/// Parses an op kind; throws invalid_argument naming the bad text.
inline op_kind parse_op_kind(std::string_view text) {
  for (int i = 0; i <= static_cast<int>(op_kind::other); ++i)
    if (text == detail::op_kind_names[i]) return static_cast<op_kind>(i);
  LOWBIT_EXPECTS(false, "unknown op kind '" + std::string(text) + "'");
  return op_kind::other;
}

/// Kinds that never run below 16 bits (QSync: their range or accuracy needs it).
constexpr bool keeps_16_bits(op_kind k) noexcept {
  return k == op_kind::layer_norm || k == op_kind::batch_norm || k == op_kind::softmax ||
         k == op_kind::gelu || k == op_kind::matmul || k == op_kind::embedding;
}

/// Kinds autocast runs at fp32 whatever it is asked (its fp32 list: layer_norm, softmax):
/// under autocast at 16 bits they take their input cast to fp32 and return fp32, and the
/// ops around them cast it back inside their own ranges.
constexpr bool autocast_runs_fp32(op_kind k) noexcept {
  return k == op_kind::layer_norm || k == op_kind::softmax;
}

/// The precision `op` of kind `k` really runs at when asked for `p`: 8-bit requests on
/// 16-bit-floor kinds are raised to fp16.
constexpr precision clamp_precision(op_kind k, precision p) noexcept {
  return keeps_16_bits(k) && storage_bits(p) < 16 ? precision::fp16 : p;
}

/// Tensor statistics the indicator reads (norms are L2). Zero means "not measured";
/// models.hpp fills shape-derived estimates for the built-ins.
struct tensor_stats {
  double weight_norm = 0.0;         ///< |W|
  double weight_absmax = 0.0;       ///< amax(W)
  double input_norm = 0.0;          ///< |X|
  double input_absmax = 0.0;        ///< amax(X)
  double input_numel = 0.0;         ///< numel(X)
  double grad_weight_norm = 0.0;    ///< |dL/dW|
  double grad_output_absmax = 0.0;  ///< amax(dL/dY)
  double grad_output_numel = 0.0;   ///< numel(dL/dY)
};

namespace detail {
// A per-precision table with every entry "not measured" (negative).
constexpr std::array<double, precision_count> unmeasured() {
  std::array<double, precision_count> a{};
  for (double& x : a) x = -1.0;
  return a;
}
}  // namespace detail

/// One operator of the iteration. Sizes are element counts, costs are forward costs.
struct op {
  std::string name;
  op_kind kind = op_kind::other;
  double flops = 0.0;         ///< forward FLOPs
  double bytes = 0.0;         ///< forward memory traffic at fp32, bytes
  double output_numel = 0.0;  ///< elements of the output (what a cast converts)
  double saved_numel = 0.0;   ///< elements kept for backward (stored at the op's precision)
  double param_numel = 0.0;   ///< parameters (kept in fp32 with fp32 gradients)
  /// Of param_numel, the parameters without gradients (requires_grad off: a frozen
  /// backbone, an embedding kept fixed): weights that take no gradient, optimizer state
  /// or share of a gradient bucket. The op still decides their compute precision.
  double frozen_numel = 0.0;
  std::vector<std::string> inputs;  ///< names of the producing ops
  /// The inputs (a subset of `inputs`) that reach this op through code between the
  /// ops (attention's core, a residual add, a view) rather than as the producer's own
  /// output: that code runs at the plan's ambient precision, so a cast on such an edge
  /// goes through it (see simulator::trace).
  std::vector<std::string> via_code;
  /// The op holding the parameters this op runs with, when it holds none of its own (a
  /// module's later call, a language model's head tied to its embedding); empty
  /// otherwise. It must be one of `inputs`. Autograd accumulates each call's gradient into
  /// the holder's: the memory model allocates that gradient at the first of the group's
  /// backwards (the last call) and holds each later one's contribution in flight.
  std::string weights_from;
  std::vector<precision> allowed;  ///< empty: whatever the device offers
  /// False for an op whose forward makes no autograd node (an identity, a dropout of
  /// p = 0, a view): it does nothing in backward, and its profile has no backward range
  /// to measure (the cost model prices its backward at 0, not from the roofline).
  bool has_backward = true;
  /// A function op's torch calls a step that lowbit's plan applier checks in Python (its
  /// torch function mode, on while the op's caller runs) where it wraps the op: the
  /// caller's calls shared among its function ops (export.py); 0 for a module's call.
  double mode_calls = 0.0;
  tensor_stats stats;
  /// Bytes the op saved for backward when profiled at each precision (indexed by
  /// index_of), negative where not measured. Measured sizes see what the storage-width
  /// rule cannot: under autocast some ops keep fp32 outputs or statistics, and views
  /// share storage. The memory model prefers them to `saved_numel * bits / 8`.
  std::array<double, precision_count> saved_bytes = detail::unmeasured();
  /// The part of `saved_bytes` that is the op's own cast of an input activation to its
  /// width (autocast casts an input that arrives at another width once per consumer: it
  /// caches only the casts of parameters), negative where not measured. The memory
  /// model counts such copies once per producer where lowbit's plan applier hands the
  /// consumers one shared copy (memory_bytes).
  std::array<double, precision_count> input_cast_bytes = detail::unmeasured();
  /// The part of `saved_bytes` that code between the ops saved after this op ran (a
  /// recording charges it to the op that ran last: attention's core after v), negative
  /// or absent where none. lowbit's plan applier runs that code at the ambient
  /// precision, so the memory model takes this part from the ambient profile.
  std::array<double, precision_count> code_saved_bytes = detail::unmeasured();
  /// Transient bytes the op allocates and frees within one call (a convolution's cuDNN
  /// workspace, a GEMM's scratch, temporaries), the larger of its forward and backward,
  /// measured at each precision; negative where not measured. At a small batch they can
  /// be the largest share of the peak above the weights and optimizer state.
  std::array<double, precision_count> workspace_bytes = detail::unmeasured();
  /// The peak the backward of the code between the ops right after this op reached above
  /// what was allocated as it started (the loss's backward after a language model's head:
  /// its fp32 logits gradients), measured at each precision; negative where not measured.
  /// It runs just before this op's backward, with the same tensors held.
  std::array<double, precision_count> code_workspace_bytes = detail::unmeasured();

  /// True when the op owns parameters (so it has a gradient to all-reduce, and it is a
  /// decision of the allocator; parameter-free ops follow their first input).
  bool has_params() const noexcept { return param_numel > 0.0; }
  /// Parameters that get a gradient (and optimizer state, and a bucket share).
  double trainable_numel() const noexcept { return param_numel - frozen_numel; }
};

/// A validated operator DAG: unique names, known inputs, no cycles. Construction throws
/// invalid_argument naming the offending op.
class op_graph {
 public:
  op_graph() = default;

  /// Validates `ops` and computes the topological order (stable: among ready ops the
  /// one listed first goes first, so orders are deterministic).
  explicit op_graph(std::vector<op> ops) : ops_(std::move(ops)) {
    const std::size_t n = ops_.size();
    std::map<std::string, std::size_t, std::less<>> index;
    for (std::size_t i = 0; i < n; ++i) {
      LOWBIT_EXPECTS(!ops_[i].name.empty(), "op #" + std::to_string(i) + " has no name");
      auto [it, fresh] = index.emplace(ops_[i].name, i);
      LOWBIT_EXPECTS(fresh, "duplicate op name '" + ops_[i].name + "' (ops #" +
                                std::to_string(it->second) + " and #" + std::to_string(i) + ")");
      LOWBIT_EXPECTS(ops_[i].flops >= 0 && ops_[i].bytes >= 0 && ops_[i].output_numel >= 0 &&
                         ops_[i].saved_numel >= 0 && ops_[i].param_numel >= 0,
                     "op '" + ops_[i].name + "' has a negative size or cost");
      LOWBIT_EXPECTS(ops_[i].frozen_numel >= 0 && ops_[i].frozen_numel <= ops_[i].param_numel,
                     "op '" + ops_[i].name + "': frozen_numel must be in [0, param_numel]");
    }
    producers_.assign(n, {});
    consumers_.assign(n, {});
    holder_.assign(n, std::nullopt);
    for (std::size_t i = 0; i < n; ++i) {
      for (const auto& in : ops_[i].inputs) {
        auto it = index.find(in);
        LOWBIT_EXPECTS(it != index.end(),
                       "op '" + ops_[i].name + "' has unknown input op '" + in + "'");
        const std::size_t j = it->second;
        if (std::find(producers_[i].begin(), producers_[i].end(), j) != producers_[i].end())
          continue;
        producers_[i].push_back(j);
        consumers_[j].push_back(i);
      }
      if (!ops_[i].weights_from.empty()) {
        const auto& from = ops_[i].weights_from;
        LOWBIT_EXPECTS(
            std::find(ops_[i].inputs.begin(), ops_[i].inputs.end(), from) != ops_[i].inputs.end(),
            "op '" + ops_[i].name + "' takes weights_from '" + from +
                "', which is not under its inputs");
        LOWBIT_EXPECTS(!ops_[i].has_params(),
                       "op '" + ops_[i].name + "' holds parameters and takes weights_from '" +
                           from + "': an op runs with its own parameters or with another's");
        // A holder of no parameters (zero-sized ones) shares nothing: no holder then.
        const std::size_t h = index.find(from)->second;
        if (ops_[h].has_params()) holder_[i] = h;
      }
      for (const auto& in : ops_[i].via_code) {
        LOWBIT_EXPECTS(
            std::find(ops_[i].inputs.begin(), ops_[i].inputs.end(), in) != ops_[i].inputs.end(),
            "op '" + ops_[i].name + "' lists '" + in + "' under via_code but not under inputs");
        via_code_.insert({i, index.find(in)->second});
      }
    }
    topo_sort_();
  }

  /// Number of ops.
  std::size_t size() const noexcept { return ops_.size(); }
  /// All ops, in the order given.
  const std::vector<op>& ops() const noexcept { return ops_; }
  /// The op at `i`.
  const op& at(std::size_t i) const { return ops_.at(i); }
  /// Distinct producers of op `i`, in the order of its inputs.
  const std::vector<std::size_t>& producers(std::size_t i) const { return producers_.at(i); }
  /// True when producer `j`'s output reaches consumer `i` through code between the ops
  /// (`j` is listed in op i's `via_code`).
  bool via_code(std::size_t i, std::size_t j) const { return via_code_.count({i, j}) != 0; }
  /// Distinct consumers of op `i`.
  const std::vector<std::size_t>& consumers(std::size_t i) const { return consumers_.at(i); }
  /// The op whose parameters op `i` runs with: `i` itself when it holds some, its
  /// `weights_from` when it runs with another op's, none for a parameter-free op.
  std::optional<std::size_t> weights_holder(std::size_t i) const {
    if (ops_.at(i).has_params()) return i;
    return holder_.at(i);
  }
  /// Forward execution order (a topological order).
  const std::vector<std::size_t>& topo_order() const noexcept { return order_; }
  /// Position of op `i` in topo_order() (its depth for the indicator).
  std::size_t depth(std::size_t i) const { return depth_.at(i); }

  /// Index of the op called `name`, if any.
  std::optional<std::size_t> find(std::string_view name) const {
    for (std::size_t i = 0; i < ops_.size(); ++i)
      if (ops_[i].name == name) return i;
    return std::nullopt;
  }
  /// Index of the op called `name`; throws invalid_argument naming it when unknown.
  std::size_t index_of(std::string_view name) const {
    auto i = find(name);
    LOWBIT_EXPECTS(i.has_value(), "unknown op '" + std::string(name) + "'");
    return *i;
  }

  /// Parameters of the whole model's ops.
  double total_params() const noexcept {
    double s = 0;
    for (const auto& o : ops_) s += o.param_numel;
    return s;
  }
  /// The ones of them that get gradients (op::trainable_numel).
  double trainable_params() const noexcept {
    double s = 0;
    for (const auto& o : ops_) s += o.trainable_numel();
    return s;
  }

 private:
  void topo_sort_() {
    const std::size_t n = ops_.size();
    std::vector<std::size_t> pending(n);
    for (std::size_t i = 0; i < n; ++i) pending[i] = producers_[i].size();
    // A min-ordered ready set keeps the order stable and independent of container
    // details; n is small enough that a linear scan is fine.
    std::vector<bool> done(n, false);
    order_.clear();
    for (;;) {
      std::size_t next = n;
      for (std::size_t i = 0; i < n; ++i)
        if (!done[i] && pending[i] == 0) {
          next = i;
          break;
        }
      if (next == n) break;
      done[next] = true;
      order_.push_back(next);
      for (std::size_t c : consumers_[next]) --pending[c];
    }
    if (order_.size() != n) report_cycle_(done);
    depth_.assign(n, 0);
    for (std::size_t k = 0; k < n; ++k) depth_[order_[k]] = k;
  }

  // Walks producers among the ops left unsorted: each has one, so the walk repeats.
  [[noreturn]] void report_cycle_(const std::vector<bool>& done) const {
    std::size_t start = 0;
    while (done[start]) ++start;
    std::vector<std::size_t> path;
    std::vector<int> seen(ops_.size(), -1);
    std::size_t cur = start;
    while (seen[cur] < 0) {
      seen[cur] = static_cast<int>(path.size());
      path.push_back(cur);
      for (std::size_t p : producers_[cur])
        if (!done[p]) {
          cur = p;
          break;
        }
    }
    // path[seen[cur]..] is the cycle walked against the edges; reverse it to follow
    // them and start at the op listed first, so the message does not depend on where
    // the walk began.
    std::vector<std::size_t> cycle(path.rbegin(),
                                   path.rend() - static_cast<std::ptrdiff_t>(seen[cur]));
    std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
    std::string text;
    for (std::size_t i : cycle) text += "'" + ops_[i].name + "' -> ";
    text += "'" + ops_[cycle.front()].name + "'";
    throw ::lowbit::invalid_argument(__FILE__, __LINE__, "cycle in the op graph: " + text);
  }

  std::vector<op> ops_;
  std::vector<std::vector<std::size_t>> producers_, consumers_;
  std::vector<std::optional<std::size_t>> holder_;  ///< weights_from, by index
  /// (consumer, producer) pairs of the edges through code between the ops, by index: the
  /// simulator asks for every edge of every plan it prices.
  std::set<std::pair<std::size_t, std::size_t>> via_code_;
  std::vector<std::size_t> order_, depth_;
};

/// One DDP gradient bucket: the parameter ops whose gradients it carries, in the order
/// backward produces them.
struct grad_bucket {
  std::vector<std::size_t> ops;
  double numel = 0.0;  ///< gradient elements in the bucket
};

/// DDP's bucketing: parameters in reverse order of production in the forward pass
/// (the order backward yields their gradients), the first bucket capped at
/// `first_cap_mb`, the others at `cap_mb` (MiB of fp32 gradients, as torch counts).
/// Parameters without gradients (op::frozen_numel) are in no bucket, as in DDP.
inline std::vector<grad_bucket> make_buckets(const op_graph& g, double cap_mb = 25.0,
                                             double first_cap_mb = 1.0) {
  LOWBIT_EXPECTS(cap_mb > 0 && first_cap_mb > 0, "bucket caps must be positive");
  std::vector<grad_bucket> out;
  grad_bucket cur;
  const auto& order = g.topo_order();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const op& o = g.at(*it);
    if (o.trainable_numel() <= 0) continue;
    cur.ops.push_back(*it);
    cur.numel += o.trainable_numel();
    const double cap = (out.empty() ? first_cap_mb : cap_mb) * 1024.0 * 1024.0;
    if (cur.numel * 4.0 >= cap) {
      out.push_back(std::move(cur));
      cur = {};
    }
  }
  if (!cur.ops.empty()) out.push_back(std::move(cur));
  return out;
}

}  // namespace lowbit::qsync
