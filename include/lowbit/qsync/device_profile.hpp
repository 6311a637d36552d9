// What the planner knows about a GPU and a link: datasheet peaks for the built-ins,
// overridable field by field with measured values.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lowbit/core/error.hpp"
#include "lowbit/qsync/precision.hpp"

namespace lowbit::qsync {

/// A cost that grows linearly with the element count: `a * numel + b` milliseconds.
struct linear_cost {
  double a_ms = 0.0;  ///< milliseconds per element
  double b_ms = 0.0;  ///< fixed milliseconds per call (launch and tail)
  /// The cost of one call on `numel` elements.
  double at(double numel) const noexcept { return a_ms * numel + b_ms; }
};

/// Cast kernel costs. Three fits cover every pair because a cast's time is set by what
/// it must do: a plain float-width change, a scaled quantization (amax pass + rounding),
/// or a dequantization.
struct cast_costs {
  linear_cost float_to_float;  ///< fp32 <-> fp16 / bf16, fp16 <-> bf16
  linear_cost quantize;        ///< anything -> int8 / fp8 (needs an amax reduction first)
  linear_cost dequantize;      ///< int8 / fp8 -> anything wider

  /// Milliseconds to convert `numel` elements from `from` to `to`; zero when the stored
  /// format does not change (same precision, or tf32 <-> fp32, both stored as fp32).
  double cost(precision from, precision to, double numel) const noexcept {
    if (from == to) return 0.0;
    const bool from8 = storage_bits(from) == 8, to8 = storage_bits(to) == 8;
    if (!from8 && !to8 && storage_bits(from) == storage_bits(to) && storage_bits(to) == 32)
      return 0.0;
    if (from8 && to8) return dequantize.at(numel) + quantize.at(numel);
    if (to8) return quantize.at(numel);
    if (from8) return dequantize.at(numel);
    return float_to_float.at(numel);
  }
};

/// QSync's cast fits measured on a T4 (REFERENCE.md). int8 -> fp32 has no published
/// fixed term; we use the fp16 cast's, since both are one elementwise launch.
inline cast_costs t4_cast_costs() {
  return {{2.878e-8, 1.009e-3}, {1.418e-7, 1.222e-2}, {2.727e-8, 1.009e-3}};
}

/// The T4 fits carried to a chip with `memory_bandwidth_gbs`: casts are memory-bound, so
/// the per-element term scales with bandwidth; the fixed (launch) term does not.
inline cast_costs scaled_cast_costs(double memory_bandwidth_gbs) {
  cast_costs c = t4_cast_costs();
  const double r = 320.0 / memory_bandwidth_gbs;
  c.float_to_float.a_ms *= r;
  c.quantize.a_ms *= r;
  c.dequantize.a_ms *= r;
  return c;
}

/// Host time a precision switch costs under lowbit's plan applier
/// (examples/pytorch/qsync/apply_plan.py), beyond the ops at their own precisions: its
/// casts of activations and gradients, and what every op it wraps costs beyond them in
/// forward (its hooks) and in backward. No profile holds them (a uniform plan wraps
/// nothing). Measured by switch_probe.py; the defaults price a cast as one launch each way
/// and a wrapped op at nothing.
struct switch_host_costs {
  double cast_forward_ms = -1.0;   ///< one edge cast in forward (Python `.to`); < 0: launch_ms
  double cast_backward_ms = -1.0;  ///< its gradient's cast (autograd's node); < 0: launch_ms
  double wrap_ms = 0.0;            ///< a wrapped op's forward hooks, autocast enter and exit
  /// A wrapped op's backward beyond its casts' gradients: what the probe's mixed chain
  /// takes in backward over its ops and its gradient casts, per wrapped op.
  double wrap_backward_ms = 0.0;
  /// One torch call checked by the applier's torch function mode (op::mode_calls of a
  /// wrapped function op).
  double mode_call_ms = 0.0;
};

/// One GPU model. All fields are public so that measured values can replace the
/// datasheet ones (see plan_io.hpp for the JSON form).
struct device_profile {
  std::string name;
  /// Dense peak rate per precision in TFLOP/s (TOP/s for int8), 0 where the chip has
  /// no such mode. Indexed by index_of(precision).
  std::array<double, precision_count> peak_tflops{};
  double memory_bandwidth_gbs = 0.0;  ///< HBM/GDDR bandwidth, GB/s (1e9 bytes)
  double memory_gib = 0.0;            ///< capacity, GiB
  /// Precisions the allocator may choose on this chip (QSync's per-GPU sets).
  std::vector<precision> precisions;
  /// Fractions of peak that real kernels reach; the roofline divides by them.
  double compute_efficiency = 0.6;
  double bandwidth_efficiency = 0.8;
  double launch_ms = 0.01;    ///< host time to launch one kernel (the CPU stream)
  double reserved_gib = 1.0;  ///< CUDA context and allocator slack, never usable
  /// Library workspace the framework allocates once and keeps (PyTorch takes cuBLAS's
  /// workspaces from its caching allocator, so they show in max_memory_allocated), MiB.
  /// Part of every plan's memory.
  double workspace_mib = 0.0;
  cast_costs casts = t4_cast_costs();
  switch_host_costs switches;  ///< the plan applier's host time per switch

  /// Host time of one edge cast's launch in forward (`backward`: of its gradient's).
  double cast_host_ms(bool backward) const noexcept {
    const double t = backward ? switches.cast_backward_ms : switches.cast_forward_ms;
    return t >= 0 ? t : launch_ms;
  }

  /// True when the chip has a mode for `p`.
  bool supports(precision p) const noexcept { return peak_tflops[index_of(p)] > 0.0; }
  /// Peak rate for `p` in FLOP/ms (so that flops / rate is milliseconds).
  double flops_per_ms(precision p) const noexcept {
    return peak_tflops[index_of(p)] * compute_efficiency * 1e9;
  }
  /// Memory bandwidth in bytes/ms as the roofline uses it.
  double bytes_per_ms() const noexcept { return memory_bandwidth_gbs * bandwidth_efficiency * 1e6; }
  /// Usable memory in bytes.
  double usable_bytes() const noexcept {
    return (memory_gib - reserved_gib) * 1024.0 * 1024.0 * 1024.0;
  }
};

namespace detail {
inline device_profile make_device(std::string name, double fp32, double tf32, double fp16,
                                  double bf16, double int8, double fp8, double bw, double gib,
                                  std::vector<precision> menu, double cublas_mib = 8.125) {
  device_profile d;
  d.name = std::move(name);
  d.peak_tflops[index_of(precision::fp32)] = fp32;
  d.peak_tflops[index_of(precision::tf32)] = tf32;
  d.peak_tflops[index_of(precision::fp16)] = fp16;
  d.peak_tflops[index_of(precision::bf16)] = bf16;
  d.peak_tflops[index_of(precision::int8)] = int8;
  d.peak_tflops[index_of(precision::fp8)] = fp8;
  d.memory_bandwidth_gbs = bw;
  d.memory_gib = gib;
  d.precisions = std::move(menu);
  d.casts = scaled_cast_costs(bw);
  d.workspace_mib = 2 * cublas_mib + 1;
  return d;
}
}  // namespace detail

// Datasheet figures, dense (no 2:4 sparsity), tensor-core rates where the chip has them.
// Menus hold every mode the chip trains in (bf16 from Ampere on). The workspace is
// PyTorch's: a cuBLAS workspace per handle and stream (by default 4096 KiB x 2 + 16 KiB x 8,
// 8.125 MiB; 32 MiB on Hopper), and a handle per thread. A training step runs forward on
// the caller's thread and backward on autograd's device thread: two workspaces, plus
// cuBLASLt's 1 MiB. On one H200 with torch 2.11 a CNN's step left 65.0 MiB that
// torch._C._cuda_clearCublasWorkspaces() released (2 x 32 + 1).
/// NVIDIA T4 (16 GB GDDR6): 8.1 fp32, 65 fp16, 130 int8 TOPS, 320 GB/s.
inline device_profile t4() {
  using P = precision;
  return detail::make_device("T4", 8.1, 0, 65, 0, 130, 0, 320, 16, {P::int8, P::fp16, P::fp32});
}
/// NVIDIA V100 SXM2 32 GB: 15.7 fp32, 125 fp16, 900 GB/s.
inline device_profile v100() {
  using P = precision;
  return detail::make_device("V100", 15.7, 0, 125, 0, 0, 0, 900, 32, {P::fp16, P::fp32});
}
/// NVIDIA A100 SXM4 80 GB: 19.5 fp32, 156 tf32, 312 fp16/bf16, 624 int8, 2039 GB/s.
inline device_profile a100() {
  using P = precision;
  return detail::make_device("A100", 19.5, 156, 312, 312, 624, 0, 2039, 80,
                             {P::int8, P::fp16, P::bf16, P::tf32, P::fp32});
}
/// NVIDIA H100 SXM5 80 GB: 67 fp32, 494.7 tf32, 989.4 fp16/bf16, 1978.9 fp8/int8,
/// 3350 GB/s.
inline device_profile h100() {
  using P = precision;
  return detail::make_device("H100", 67, 494.7, 989.4, 989.4, 1978.9, 1978.9, 3350, 80,
                             {P::fp8, P::fp16, P::bf16, P::tf32, P::fp32}, 32);
}
/// NVIDIA H200 SXM 141 GB: H100's compute with 4800 GB/s HBM3e.
inline device_profile h200() {
  using P = precision;
  return detail::make_device("H200", 67, 494.7, 989.4, 989.4, 1978.9, 1978.9, 4800, 141,
                             {P::fp8, P::fp16, P::bf16, P::tf32, P::fp32}, 32);
}

/// Names accepted by builtin_device.
inline std::vector<std::string> builtin_device_names() {
  return {"T4", "V100", "A100", "H100", "H200"};
}

/// A built-in profile by name (case as listed by builtin_device_names).
inline device_profile builtin_device(std::string_view name) {
  if (name == "T4") return t4();
  if (name == "V100") return v100();
  if (name == "A100") return a100();
  if (name == "H100") return h100();
  if (name == "H200") return h200();
  LOWBIT_EXPECTS(
      false, "unknown device '" + std::string(name) + "' (built-ins: T4, V100, A100, H100, H200)");
  return {};
}

/// The link every rank's all-reduce crosses (the slowest one in a hybrid cluster).
struct link_profile {
  std::string name;
  double bandwidth_gbs = 0.0;  ///< per direction, per rank, GB/s (1e9 bytes)
  double latency_ms = 0.0;     ///< per ring step (alpha)
};

/// Names accepted by builtin_link.
inline std::vector<std::string> builtin_link_names() {
  return {"pcie3",   "pcie4",        "pcie5",         "nvlink2", "nvlink3",
          "nvlink4", "ethernet-25g", "ethernet-100g", "ib-hdr",  "ib-ndr"};
}

/// A built-in link class by name. Bandwidths are per direction: PCIe x16 3.0/4.0/5.0
/// (15.75/31.5/63 GB/s), NVLink 2/3/4 as on V100/A100/H100 (150/300/450 GB/s),
/// Ethernet 25/100 Gb/s, InfiniBand HDR/NDR (200/400 Gb/s). Latencies are typical
/// per-hop NCCL figures: TCP Ethernet tens of microseconds, RDMA and NVLink a few.
inline link_profile builtin_link(std::string_view name) {
  if (name == "pcie3") return {"pcie3", 15.75, 0.010};
  if (name == "pcie4") return {"pcie4", 31.5, 0.008};
  if (name == "pcie5") return {"pcie5", 63.0, 0.006};
  if (name == "nvlink2") return {"nvlink2", 150.0, 0.004};
  if (name == "nvlink3") return {"nvlink3", 300.0, 0.003};
  if (name == "nvlink4") return {"nvlink4", 450.0, 0.003};
  if (name == "ethernet-25g") return {"ethernet-25g", 25.0 / 8.0, 0.030};
  if (name == "ethernet-100g") return {"ethernet-100g", 100.0 / 8.0, 0.020};
  if (name == "ib-hdr") return {"ib-hdr", 200.0 / 8.0, 0.005};
  if (name == "ib-ndr") return {"ib-ndr", 400.0 / 8.0, 0.004};
  std::string known;
  for (const auto& n : builtin_link_names()) known += (known.empty() ? "" : ", ") + n;
  LOWBIT_EXPECTS(false, "unknown link '" + std::string(name) + "' (built-ins: " + known + ")");
  return {};
}

}  // namespace lowbit::qsync
