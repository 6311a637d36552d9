// The lowbit backend's lowbit path (process_group.h's lowbit_collectives) over the
// extension's collective handles: the same all_reduce, reduce_scatter and all_gather that
// the DDP hook and the FSDP2 collectives build (collective_bindings.cpp), here chosen per
// call. Host code only: it instantiates no collective.
#include <torch/extension.h>

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.h"
#include "choices.h"
#include "collectives.h"
#include "process_group.h"

namespace lowbit_torch {

namespace {

/// `count` rounded up to whole codec blocks: lowbit shards in whole blocks.
std::int64_t whole_blocks(std::int64_t count) {
  return (count + codec_block - 1) / codec_block * codec_block;
}

/// What the backend's lowbit path runs with (lowbit_torch/backend.py's Options).
struct path_options {
  codec_choice reduce;  ///< all_reduce's and reduce_scatter's codec
  feedback_kind all_reduce_feedback = feedback_kind::none;
  feedback_kind reduce_scatter_feedback = feedback_kind::none;
  codec_choice gather;  ///< all_gather's codec
  std::uint64_t seed = 0;
  std::int64_t feedback_tensors = 64;  ///< tensors that keep feedback state at once
};

/// The collectives, made on first use and kept: without feedback one per (operation,
/// dtype, average), rebuilt larger when a larger tensor comes; with feedback one per
/// tensor (its data pointer, size and dtype), whose state is that tensor's, the least
/// recently used dropped past feedback_tensors. Every rank makes the same calls in the same
/// order, so every rank builds (collectively, on the node backend) the same collectives
/// at the same calls.
class handle_collectives final : public lowbit_collectives {
  // (operation, data pointer or 0, numel or 0, dtype, average)
  using key = std::tuple<int, std::uintptr_t, std::int64_t, int, bool>;

  template <class Handle>
  struct entry {
    std::unique_ptr<Handle> handle;
    std::list<key>::iterator lru;  // keyed entries only
  };

 public:
  handle_collectives(communicator comm, path_options options)
      : comm_(std::move(comm)), options_(options) {}

  void all_reduce(const at::Tensor& tensor, bool average) override {
    const bool keyed = options_.all_reduce_feedback != feedback_kind::none;
    auto& h = find(all_reduce_, 0, tensor, keyed, average, tensor.numel(), [&](std::int64_t n) {
      return make_all_reduce(comm_, tensor.scalar_type(), n, options_.reduce,
                             options_.all_reduce_feedback,
                             make_config(average, options_.seed, 0, "automatic"));
    });
    h.run(tensor, tensor, options_.reduce.bits);
  }

  void reduce_scatter(const at::Tensor& output, const at::Tensor& input, bool average) override {
    const std::int64_t world = comm_.size();
    const std::int64_t chunk = output.numel();
    const std::int64_t padded = whole_blocks(chunk);
    const bool keyed = options_.reduce_scatter_feedback != feedback_kind::none;
    auto& h = find(reduce_scatter_, 1, input, keyed, average, padded * world, [&](std::int64_t n) {
      return make_reduce_scatter(comm_, input.scalar_type(), n, options_.reduce,
                                 options_.reduce_scatter_feedback,
                                 make_config(average, options_.seed, 0, "automatic"));
    });
    if (padded == chunk) {
      h.run(input.view(-1), output.view(-1));
      return;
    }
    // Each rank's chunk followed by zeros up to whole blocks (a zero cannot change a
    // block's scale), on this stream for this call alone.
    at::Tensor src = at::empty({world, padded}, input.options());
    src.narrow(1, chunk, padded - chunk).zero_();
    src.narrow(1, 0, chunk).copy_(input.view({world, chunk}));
    at::Tensor dst = at::empty({padded}, output.options());
    h.run(src.view(-1), dst);
    output.view(-1).copy_(dst.narrow(0, 0, chunk));
  }

  void all_gather(const at::Tensor& output, const at::Tensor& input) override {
    const std::int64_t world = comm_.size();
    const std::int64_t chunk = input.numel();
    const std::int64_t padded = whole_blocks(chunk);
    auto& h = find(all_gather_, 2, input, false, false, padded * world, [&](std::int64_t n) {
      return make_all_gather(comm_, input.scalar_type(), n, options_.gather,
                             make_config(false, options_.seed, 0, "automatic"));
    });
    if (padded == chunk) {
      h.run(input.view(-1), output.view(-1));
      return;
    }
    at::Tensor src = at::empty({padded}, input.options());
    src.narrow(0, chunk, padded - chunk).zero_();
    src.narrow(0, 0, chunk).copy_(input.view(-1));
    at::Tensor dst = at::empty({world * padded}, output.options());
    h.run(src, dst);
    output.view({world, chunk}).copy_(dst.view({world, padded}).narrow(1, 0, chunk));
  }

  std::string backend() const override { return backend_name(comm_.backend()); }

  std::vector<std::pair<std::string, std::int64_t>> counters() const override {
    return {{"built_all_reduce", built_[0]},
            {"built_reduce_scatter", built_[1]},
            {"built_all_gather", built_[2]},
            {"feedback_tensors", static_cast<std::int64_t>(lru_.size())},
            {"feedback_dropped", dropped_}};
  }

 private:
  /// The collective of (op, tensor) able to take `count` values: the one kept, or a new one
  /// from make(count) (which replaces a smaller one of the same key).
  template <class Handle, class Make>
  Handle& find(std::map<key, entry<Handle>>& map, int op, const at::Tensor& tensor, bool keyed,
               bool average, std::int64_t count, Make&& make) {
    const key k{op, keyed ? reinterpret_cast<std::uintptr_t>(tensor.data_ptr()) : 0,
                keyed ? tensor.numel() : 0, static_cast<int>(tensor.scalar_type()), average};
    auto it = map.find(k);
    if (it != map.end() && it->second.handle->max_count() >= count) {
      if (keyed) lru_.splice(lru_.end(), lru_, it->second.lru);  // now the most recent
      return *it->second.handle;
    }
    if (it != map.end()) {  // too small: its workspace goes before the larger one comes
      if (keyed) lru_.erase(it->second.lru);
      map.erase(it);
    }
    if (keyed && static_cast<std::int64_t>(lru_.size()) >= options_.feedback_tensors) {
      drop_oldest();
    }
    entry<Handle> e{make(count), {}};
    ++built_[op];
    if (keyed) e.lru = lru_.insert(lru_.end(), k);
    return *map.emplace(k, std::move(e)).first->second.handle;
  }

  void drop_oldest() {
    const key k = lru_.front();
    lru_.pop_front();
    all_reduce_.erase(k);
    reduce_scatter_.erase(k);
    ++dropped_;
  }

  communicator comm_;
  path_options options_;
  std::map<key, entry<all_reduce_handle>> all_reduce_;
  std::map<key, entry<shard_collective_handle>> reduce_scatter_;
  std::map<key, entry<shard_collective_handle>> all_gather_;
  std::list<key> lru_;  // keyed entries, least recently used first
  std::int64_t built_[3] = {0, 0, 0};
  std::int64_t dropped_ = 0;
};

}  // namespace

void bind_lowbit_collectives(pybind11::module_& m) {
  namespace py = pybind11;
  m.def(
      "make_lowbit_collectives",
      [](const communicator& comm, int bits, const std::string& grid, const std::string& rounding,
         const std::string& all_reduce_feedback, const std::string& reduce_scatter_feedback,
         int gather_bits, const std::string& gather_grid, std::uint64_t seed,
         std::int64_t feedback_tensors) -> std::shared_ptr<lowbit_collectives> {
        TORCH_CHECK_VALUE(feedback_tensors > 0, "lowbit_torch: feedback_tensors must be > 0, got ",
                          feedback_tensors);
        path_options o;
        o.reduce = make_codec(bits, grid, rounding);
        o.all_reduce_feedback = make_feedback(all_reduce_feedback);
        o.reduce_scatter_feedback = make_feedback(reduce_scatter_feedback);
        o.gather = make_codec(gather_bits, gather_grid, rounding);
        o.seed = seed;
        o.feedback_tensors = feedback_tensors;
        return std::make_shared<handle_collectives>(comm, o);
      },
      py::arg("comm"), py::arg("bits"), py::arg("grid"), py::arg("rounding"),
      py::arg("all_reduce_feedback"), py::arg("reduce_scatter_feedback"), py::arg("gather_bits"),
      py::arg("gather_grid"), py::arg("seed"), py::arg("feedback_tensors"),
      "The lowbit backend's lowbit path on `comm` (make_process_group's `lowbit`).");
}

}  // namespace lowbit_torch
