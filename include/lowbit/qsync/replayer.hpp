// Replays one iteration on three in-order streams per device (host launches, compute,
// communication), with DDP buckets that all devices all-reduce together.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <vector>

#include "lowbit/core/error.hpp"

namespace lowbit::qsync {

/// What a kernel does (for reports and tests; the replay treats all alike).
/// `code`: the code between the ops (residual adds, functional attention, a loss) measured
/// before an op, issued with that op's host time.
enum class kernel_kind { forward, backward, cast, optimizer, code };

/// Marks "no op" in kernel::op and "ready at time 0" in device_trace::bucket_ready.
inline constexpr std::size_t no_index = std::numeric_limits<std::size_t>::max();

/// One kernel: the host time to launch it and its GPU time.
struct kernel {
  double cpu_ms = 0.0;
  double gpu_ms = 0.0;
  kernel_kind kind = kernel_kind::forward;
  std::size_t op = no_index;  ///< the op it belongs to, if any
};

/// One device's iteration: its kernels in issue order, the kernel after which each
/// bucket's gradients exist, and the work after all buckets (the optimizer step and
/// whatever else no op accounts for): its GPU time and the host time that issues it.
struct device_trace {
  std::vector<kernel> kernels;
  std::vector<std::size_t> bucket_ready;  ///< kernel index per bucket, or no_index
  double tail_ms = 0.0;
  double tail_cpu_ms = 0.0;
};

/// Host and compute stream times of one device's kernels.
struct stream_times {
  std::vector<double> start, end;  ///< per kernel, on the compute stream
  double cpu_end = 0.0;            ///< when the host issued the last kernel
  double compute_end = 0.0;        ///< when the compute stream went idle
};

/// Replays the host and compute streams: the host issues kernel i after issuing
/// kernel i-1 (it never waits for the GPU), and the GPU runs kernel i once it is issued
/// and kernel i-1 is done. The longest path through these two chains.
inline stream_times replay_streams(const std::vector<kernel>& kernels) {
  stream_times t;
  t.start.resize(kernels.size());
  t.end.resize(kernels.size());
  double cpu = 0.0, gpu = 0.0;
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    cpu += kernels[i].cpu_ms;
    t.start[i] = std::max(cpu, gpu);
    gpu = t.start[i] + kernels[i].gpu_ms;
    t.end[i] = gpu;
  }
  t.cpu_end = cpu;
  t.compute_end = gpu;
  return t;
}

/// What the synchronous replay needs from one device: when each bucket's gradients
/// exist, when its host and compute streams finish, and its tail.
struct device_timing {
  std::vector<double> bucket_ready_ms;
  double cpu_end = 0.0;
  double compute_end = 0.0;
  double tail_ms = 0.0;
  double tail_cpu_ms = 0.0;
};

/// Reads a device's timing off its trace and stream replay.
inline device_timing timing_of(const device_trace& trace, const stream_times& streams) {
  device_timing t;
  for (std::size_t at : trace.bucket_ready)
    t.bucket_ready_ms.push_back(at == no_index ? 0.0 : streams.end.at(at));
  t.cpu_end = streams.cpu_end;
  t.compute_end = streams.compute_end;
  t.tail_ms = trace.tail_ms;
  t.tail_cpu_ms = trace.tail_cpu_ms;
  return t;
}

/// The result of a synchronous replay over several devices.
struct sync_times {
  std::vector<double> bucket_start, bucket_end;  ///< shared by every device
  std::vector<double> device_ms;                 ///< each device's iteration time
  double iteration_ms = 0.0;                     ///< the slowest device's
  std::size_t slowest = 0;                       ///< which device that is
};

/// Synchronous data-parallel replay. Buckets run FIFO on the communication stream; as
/// a collective, bucket k starts on every device at the latest of their ready times
/// (and after bucket k-1) and lasts the longest of their durations. A device finishes
/// when its compute, its host and the last bucket are done, plus its tail's GPU time,
/// or when its host has issued the tail (`cpu_end + tail_cpu_ms`), whichever is later:
/// a host-bound iteration ends with the host.
/// `comm_ms[d][k]` is device d's duration of bucket k.
inline sync_times replay_sync(const std::vector<device_timing>& devices,
                              const std::vector<std::vector<double>>& comm_ms) {
  LOWBIT_EXPECTS(!devices.empty(), "replay needs at least one device");
  LOWBIT_EXPECTS(comm_ms.size() == devices.size(), "one comm row per device is needed");
  const std::size_t buckets = devices[0].bucket_ready_ms.size();
  for (std::size_t d = 0; d < devices.size(); ++d)
    LOWBIT_EXPECTS(devices[d].bucket_ready_ms.size() == buckets && comm_ms[d].size() == buckets,
                   "every device must have the same buckets");
  sync_times r;
  r.bucket_start.resize(buckets);
  r.bucket_end.resize(buckets);
  double comm = 0.0;
  for (std::size_t k = 0; k < buckets; ++k) {
    double ready = comm, dur = 0.0;
    for (std::size_t d = 0; d < devices.size(); ++d) {
      ready = std::max(ready, devices[d].bucket_ready_ms[k]);
      dur = std::max(dur, comm_ms[d][k]);
    }
    r.bucket_start[k] = ready;
    comm = r.bucket_end[k] = ready + dur;
  }
  r.device_ms.resize(devices.size());
  for (std::size_t d = 0; d < devices.size(); ++d) {
    const double done = std::max({devices[d].compute_end, devices[d].cpu_end, comm});
    r.device_ms[d] =
        std::max(done + devices[d].tail_ms, devices[d].cpu_end + devices[d].tail_cpu_ms);
    if (r.device_ms[d] > r.device_ms[r.slowest]) r.slowest = d;
  }
  r.iteration_ms = r.device_ms[r.slowest];
  return r;
}

/// Single-device replay of a trace with bucket durations `comm_ms`.
inline sync_times replay(const device_trace& dev, const std::vector<double>& comm_ms) {
  return replay_sync({timing_of(dev, replay_streams(dev.kernels))}, {comm_ms});
}

}  // namespace lowbit::qsync
