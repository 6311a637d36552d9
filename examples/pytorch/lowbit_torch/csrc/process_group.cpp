// The "lowbit" torch.distributed backend (process_group.h): routing, the lowbit path's
// streams and Work, and the forwarding of every other call to the inner backend. Host code
// without CUDA headers (streams and events through c10's device-generic API).
#include "process_group.h"

#include <ATen/core/ivalue.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <type_traits>

namespace lowbit_torch {

bool route_table::takes(lowbit_op op, at::ScalarType dtype, std::int64_t nbytes,
                        reduce_kind reduce) const {
  const auto& allowed = dtypes[static_cast<std::size_t>(op)];
  const bool reduce_ok = op == lowbit_op::all_gather
                             ? reduce == reduce_kind::none
                             : reduce == reduce_kind::sum || reduce == reduce_kind::avg;
  return reduce_ok && nbytes > 0 && nbytes >= min_bytes &&
         std::find(allowed.begin(), allowed.end(), dtype) != allowed.end();
}

namespace {

reduce_kind reduce_of(const c10d::ReduceOp& op) {
  if (op.op_ == c10d::ReduceOp::SUM) return reduce_kind::sum;
  if (op.op_ == c10d::ReduceOp::AVG) return reduce_kind::avg;
  return reduce_kind::other;
}

/// The Work of a call on the lowbit path. wait() and synchronize() make the caller's
/// current stream wait for the collective's stream (no host wait); getFuture() is a
/// CUDA-aware future completed with the output tensors, its events recorded on the
/// collective's stream.
class lowbit_work final : public c10d::Work {
 public:
  lowbit_work(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
              c10::intrusive_ptr<c10::ivalue::Future> future, c10::Event done, c10::Device device)
      : c10d::Work(rank, type),
        outputs_(std::move(outputs)),
        future_(std::move(future)),
        done_(std::move(done)),
        device_(device) {}

  bool isCompleted() override { return done_.query(); }
  bool isSuccess() const override { return true; }
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override {
    const c10::impl::VirtualGuardImpl impl(device_.type());
    done_.block(impl.getStream(device_));
  }
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    synchronize();
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  c10::Event done_;
  c10::Device device_;
};

// c10d::Backend's virtual functions that some of the torch releases supported (2.6 and
// later) lack: the backend defines them without `override` (a new function where the base
// has none) and calls the inner backend's only where it exists.
#define LOWBIT_TORCH_HAS_MEMBER(trait, call) \
  template <class B, class = void>           \
  struct trait : std::false_type {};         \
  template <class B>                         \
  struct trait<B, std::void_t<decltype(std::declval<B&>().call)>> : std::true_type {};
LOWBIT_TORCH_HAS_MEMBER(has_supports_coalescing, supportsCoalescing())
LOWBIT_TORCH_HAS_MEMBER(has_abort, abort())
LOWBIT_TORCH_HAS_MEMBER(has_shutdown, shutdown())
LOWBIT_TORCH_HAS_MEMBER(has_set_timeout, setTimeout(std::chrono::milliseconds{}))
LOWBIT_TORCH_HAS_MEMBER(has_wait_for_pending_works, waitForPendingWorks())
#undef LOWBIT_TORCH_HAS_MEMBER

/// The backend (process_group.h).
class process_group final : public c10d::Backend {
 public:
  process_group(c10::intrusive_ptr<c10d::Backend> inner, std::shared_ptr<lowbit_collectives> lowbit,
                route_table routes, c10::Device device)
      : c10d::Backend(inner->getRank(), inner->getSize()),
        inner_(std::move(inner)),
        lowbit_(std::move(lowbit)),
        routes_(std::move(routes)),
        device_(device) {}

  const std::string getBackendName() const override { return "lowbit"; }

  // ------------------------------------------------------------- the lowbit path or not
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const reduce_kind reduce = reduce_of(opts.reduceOp);
    if (tensors.size() == 1 && fits(tensors[0]) &&
        routes_.takes(lowbit_op::all_reduce, tensors[0].scalar_type(), bytes(tensors[0]), reduce) &&
        taken()) {
      return lowbit_call(lowbit_op::all_reduce, c10d::OpType::ALLREDUCE, tensors[0], tensors[0],
                         reduce);
    }
    return forwarded(lowbit_op::all_reduce, inner_->allreduce(tensors, opts));
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    const reduce_kind reduce = reduce_of(opts.reduceOp);
    if (fits(output) && fits(input) && apart(output, input) &&
        output.scalar_type() == input.scalar_type() &&
        input.numel() == output.numel() * getSize() &&
        routes_.takes(lowbit_op::reduce_scatter, input.scalar_type(), bytes(input), reduce) &&
        taken()) {
      return lowbit_call(lowbit_op::reduce_scatter, c10d::OpType::_REDUCE_SCATTER_BASE, input,
                         output, reduce);
    }
    return forwarded(lowbit_op::reduce_scatter, inner_->_reduce_scatter_base(output, input, opts));
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    if (fits(output) && fits(input) && apart(output, input) &&
        output.scalar_type() == input.scalar_type() &&
        output.numel() == input.numel() * getSize() &&
        routes_.takes(lowbit_op::all_gather, input.scalar_type(), bytes(output),
                      reduce_kind::none) &&
        taken()) {
      return lowbit_call(lowbit_op::all_gather, c10d::OpType::_ALLGATHER_BASE, input, output,
                         reduce_kind::none);
    }
    return forwarded(lowbit_op::all_gather, inner_->_allgather_base(output, input, opts));
  }

  // ------------------------------------------------------------ forwarded, unchanged
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return forwarded(inner_->broadcast(tensors, opts));
  }
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override {
    return forwarded(inner_->allreduce_sparse(tensors, opts));
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    return forwarded(inner_->allreduce_coalesced(tensors, opts));
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    return forwarded(inner_->reduce(tensors, opts));
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    return forwarded(inner_->allgather(outputs, inputs, opts));
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    return forwarded(inner_->allgather_coalesced(outputs, inputs, opts));
  }
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    return forwarded(inner_->allgather_into_tensor_coalesced(outputs, inputs, opts));
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    return forwarded(inner_->gather(outputs, inputs, opts));
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    return forwarded(inner_->scatter(outputs, inputs, opts));
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    return forwarded(inner_->reduce_scatter(outputs, inputs, opts));
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    return forwarded(inner_->reduce_scatter_tensor_coalesced(outputs, inputs, opts));
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    return forwarded(inner_->alltoall_base(output, input, output_splits, input_splits, opts));
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    return forwarded(inner_->alltoall(outputs, inputs, opts));
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return forwarded(inner_->send(tensors, dst, tag));
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return forwarded(inner_->recv(tensors, src, tag));
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return forwarded(inner_->recvAnysource(tensors, tag));
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return forwarded(inner_->barrier(opts));
  }
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    inner_->monitoredBarrier(opts, wait_all_ranks);
  }
  void setSequenceNumberForGroup() override { inner_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return inner_->getSequenceNumberForGroup(); }

  // Inside a coalescing region every call goes to the inner backend, which holds the
  // region's calls until endCoalescing.
  void startCoalescing() override {
    inner_->startCoalescing();
    coalescing_ = true;
  }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    coalescing_ = false;
    return inner_->endCoalescing();
  }

  // Without `override`: absent from some supported torch releases' c10d::Backend.
  bool supportsCoalescing() const {
    if constexpr (has_supports_coalescing<const c10d::Backend>::value) {
      return inner_->supportsCoalescing();
    }
    return false;
  }
  void setTimeout(std::chrono::milliseconds timeout) {
    if constexpr (has_set_timeout<c10d::Backend>::value) inner_->setTimeout(timeout);
  }
  void waitForPendingWorks() {
    if constexpr (has_wait_for_pending_works<c10d::Backend>::value) inner_->waitForPendingWorks();
  }
  // lowbit's collectives go first: on NCCL they borrow the inner backend's communicator.
  void abort() {
    release();
    if constexpr (has_abort<c10d::Backend>::value) inner_->abort();
  }
  void shutdown() {
    release();
    if constexpr (has_shutdown<c10d::Backend>::value) inner_->shutdown();
  }

  /// Calls per operation on each path, and the lowbit collectives' own counters.
  std::vector<std::pair<std::string, std::int64_t>> stats() const {
    static const char* const names[] = {"all_reduce", "reduce_scatter", "all_gather"};
    std::vector<std::pair<std::string, std::int64_t>> out;
    for (std::size_t i = 0; i < 3; ++i) {
      out.emplace_back(std::string("lowbit_") + names[i], lowbit_calls_[i].load());
      out.emplace_back(std::string("forwarded_") + names[i], forwarded_calls_[i].load());
    }
    out.emplace_back("forwarded_other", forwarded_other_.load());
    std::lock_guard<std::mutex> lock(mutex_);
    if (lowbit_) {
      for (auto& kv : lowbit_->counters()) out.push_back(kv);
    }
    return out;
  }
  std::string lowbit_backend() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return lowbit_ ? lowbit_->backend() : "none";
  }
  const c10::intrusive_ptr<c10d::Backend>& inner() const { return inner_; }

 private:
  static std::int64_t bytes(const at::Tensor& t) {
    return t.numel() * static_cast<std::int64_t>(t.element_size());
  }
  /// A tensor the lowbit path can take: dense, contiguous, on the backend's device.
  bool fits(const at::Tensor& t) const {
    return t.defined() && t.layout() == at::kStrided && t.is_contiguous() && t.device() == device_;
  }
  /// Whether the call may leave the inner backend at all.
  bool taken() const { return !coalescing_ && lowbit_ != nullptr; }
  /// Distinct storages (an all-gather into a tensor whose slice is the input is
  /// forwarded).
  static bool apart(const at::Tensor& a, const at::Tensor& b) {
    return !a.storage().is_alias_of(b.storage());
  }

  c10::intrusive_ptr<c10d::Work> forwarded(lowbit_op op, c10::intrusive_ptr<c10d::Work> w) {
    ++forwarded_calls_[static_cast<std::size_t>(op)];
    return w;
  }
  c10::intrusive_ptr<c10d::Work> forwarded(c10::intrusive_ptr<c10d::Work> w) {
    ++forwarded_other_;
    return w;
  }

  /// Runs `op` on the backend's stream after the caller's current stream has reached this
  /// point; returns a Work whose wait() orders the caller's stream after it.
  c10::intrusive_ptr<c10d::Work> lowbit_call(lowbit_op op, c10d::OpType type,
                                             const at::Tensor& input, const at::Tensor& output,
                                             reduce_kind reduce) {
    const c10::DeviceGuard device_guard(device_);
    const c10::impl::VirtualGuardImpl impl(device_.type());
    const c10::Stream caller = impl.getStream(device_);
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(lowbit_ != nullptr, "lowbit_torch: the lowbit backend was shut down");
    if (!stream_) stream_ = impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
    const c10::Stream stream = *stream_;
    c10::Event ready(device_.type());
    ready.record(caller);
    ready.block(stream);
    const c10::StreamGuard stream_guard(stream);
    const bool average = reduce == reduce_kind::avg;
    switch (op) {
      case lowbit_op::all_reduce:
        lowbit_->all_reduce(output, average);
        break;
      case lowbit_op::reduce_scatter:
        lowbit_->reduce_scatter(output, input, average);
        break;
      case lowbit_op::all_gather:
        lowbit_->all_gather(output, input);
        break;
    }
    // The caller's tensors, used on this stream: their memory is not reused before it is
    // done with them.
    input.record_stream(stream);
    if (!output.is_same(input)) output.record_stream(stream);
    std::vector<at::Tensor> outputs{output};
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors(),
                                                           std::vector<c10::Device>{device_});
    future->markCompleted(c10::IValue(outputs));  // events recorded on `stream`
    c10::Event done(device_.type());
    done.record(stream);
    ++lowbit_calls_[static_cast<std::size_t>(op)];
    return c10::make_intrusive<lowbit_work>(getRank(), type, std::move(outputs), std::move(future),
                                            std::move(done), device_);
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    lowbit_.reset();
  }

  // inner_ before lowbit_: members go in reverse order, so lowbit's collectives (which may
  // borrow the inner NCCL communicator) go first.
  c10::intrusive_ptr<c10d::Backend> inner_;
  std::shared_ptr<lowbit_collectives> lowbit_;
  const route_table routes_;
  const c10::Device device_;
  mutable std::mutex mutex_;  // the lowbit path: its collectives' caches and stream
  std::optional<c10::Stream> stream_;
  std::atomic<bool> coalescing_{false};
  std::array<std::atomic<std::int64_t>, 3> lowbit_calls_{};
  std::array<std::atomic<std::int64_t>, 3> forwarded_calls_{};
  std::atomic<std::int64_t> forwarded_other_{0};
};

lowbit_op op_of(const std::string& name) {
  if (name == "all_reduce") return lowbit_op::all_reduce;
  if (name == "reduce_scatter") return lowbit_op::reduce_scatter;
  TORCH_CHECK_VALUE(
      name == "all_gather",
      "lowbit_torch: op must be 'all_reduce', 'reduce_scatter' or 'all_gather', got '", name, "'");
  return lowbit_op::all_gather;
}

reduce_kind reduce_of(const std::string& name) {
  if (name == "none") return reduce_kind::none;
  if (name == "sum") return reduce_kind::sum;
  if (name == "avg") return reduce_kind::avg;
  TORCH_CHECK_VALUE(name == "other",
                    "lowbit_torch: reduce must be 'none', 'sum', 'avg' or 'other', got '", name,
                    "'");
  return reduce_kind::other;
}

process_group& ours(const c10::intrusive_ptr<c10d::Backend>& b) {
  auto* p = dynamic_cast<process_group*>(b.get());
  TORCH_CHECK_VALUE(p != nullptr, "lowbit_torch: not a lowbit backend (its name is '",
                    b ? b->getBackendName() : std::string("none"), "')");
  return *p;
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_process_group(c10::intrusive_ptr<c10d::Backend> inner,
                                                     std::shared_ptr<lowbit_collectives> lowbit,
                                                     route_table routes, c10::Device device) {
  TORCH_CHECK_VALUE(inner, "lowbit_torch: the lowbit backend needs an inner backend");
  return c10::make_intrusive<process_group>(std::move(inner), std::move(lowbit), std::move(routes),
                                            device);
}

void bind_process_group(pybind11::module_& m) {
  namespace py = pybind11;
  // module_local: the tests build this file into a second module (the host half alone) in
  // the same process as the extension; pybind11 registers a C++ type once per process
  // unless it is local, and the second import would fail ("already registered").
  py::class_<route_table>(m, "RouteTable", py::module_local())
      .def(py::init([](std::vector<at::ScalarType> all_reduce,
                       std::vector<at::ScalarType> reduce_scatter,
                       std::vector<at::ScalarType> all_gather, std::int64_t min_bytes) {
             TORCH_CHECK_VALUE(min_bytes >= 0, "lowbit_torch: min_bytes must be >= 0, got ",
                               min_bytes);
             route_table t;
             t.dtypes = {std::move(all_reduce), std::move(reduce_scatter), std::move(all_gather)};
             t.min_bytes = min_bytes;
             return t;
           }),
           py::arg("all_reduce"), py::arg("reduce_scatter"), py::arg("all_gather"),
           py::arg("min_bytes"))
      .def(
          "takes",
          [](const route_table& t, const std::string& op, at::ScalarType dtype, std::int64_t nbytes,
             const std::string& reduce) {
            return t.takes(op_of(op), dtype, nbytes, reduce_of(reduce));
          },
          py::arg("op"), py::arg("dtype"), py::arg("nbytes"), py::arg("reduce"))
      .def_readonly("min_bytes", &route_table::min_bytes);

  py::class_<lowbit_collectives, std::shared_ptr<lowbit_collectives>>(m, "LowbitCollectives",
                                                                      py::module_local())
      .def_property_readonly("backend", &lowbit_collectives::backend);

  m.def(
      "make_process_group",
      [](c10::intrusive_ptr<c10d::Backend> inner, py::object lowbit, route_table routes,
         c10::Device device) {
        std::shared_ptr<lowbit_collectives> path;
        if (!lowbit.is_none()) path = lowbit.cast<std::shared_ptr<lowbit_collectives>>();
        return make_process_group(std::move(inner), std::move(path), std::move(routes), device);
      },
      py::arg("inner"), py::arg("lowbit"), py::arg("routes"), py::arg("device"),
      "The lowbit backend over `inner` (a c10d Backend); lowbit None forwards every call.");
  m.def(
      "process_group_stats",
      [](const c10::intrusive_ptr<c10d::Backend>& b) {
        process_group& pg = ours(b);
        std::vector<std::pair<std::string, std::int64_t>> counts;
        std::string lowbit;
        {
          // The lowbit path holds the backend's lock while it builds a collective, which on
          // the node backend calls Python (its bootstrap): never wait for it with the GIL.
          py::gil_scoped_release nogil;
          counts = pg.stats();
          lowbit = pg.lowbit_backend();
        }
        py::dict d;
        for (auto& kv : counts) d[py::str(kv.first)] = kv.second;
        d["lowbit_backend"] = lowbit;
        return d;
      },
      py::arg("backend"));
  m.def(
      "process_group_inner",
      [](const c10::intrusive_ptr<c10d::Backend>& b) { return ours(b).inner(); },
      py::arg("backend"), "The inner backend that takes the forwarded calls.");
}

}  // namespace lowbit_torch
