// Built-in example models with real layer shapes (ResNet-50, BERT-base) and example
// clusters (4x T4 + 4x V100 over 25 Gb/s Ethernet; 2x H200 over NVLink).
#pragma once

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "lowbit/core/error.hpp"
#include "lowbit/qsync/cluster.hpp"
#include "lowbit/qsync/device_profile.hpp"
#include "lowbit/qsync/op_graph.hpp"

namespace lowbit::qsync {

namespace detail {

// Shape-derived stand-ins for the statistics a profiling run would measure:
// He-initialised weights (std sqrt(2 / fan_in), amax 4 std), unit-RMS activations
// with amax `x_amax`, output gradients of RMS 1e-4 and weight gradients of RMS 1e-3.
// Real runs should pass measured statistics in the model JSON.
inline void estimate_stats(op& o, double fan_in, double input_numel, double x_amax = 6.0) {
  tensor_stats& s = o.stats;
  const double w_std = fan_in > 0 ? std::sqrt(2.0 / fan_in) : 1.0;
  s.weight_norm = w_std * std::sqrt(o.param_numel);
  s.weight_absmax = 4.0 * w_std;
  s.input_numel = input_numel;
  s.input_norm = std::sqrt(input_numel);
  s.input_absmax = x_amax;
  s.grad_output_numel = o.output_numel;
  s.grad_output_absmax = 6.0 * 1e-4;
  s.grad_weight_norm = 1e-3 * std::sqrt(o.param_numel);
}

// Appends ops and keeps the name of the latest one, so blocks read top to bottom.
class graph_builder {
 public:
  std::vector<op> ops;

  const std::string& add(op o) {
    ops.push_back(std::move(o));
    return ops.back().name;
  }

  // 2-D convolution without bias, square kernel, padding k/2; h is the input side.
  std::string conv(const std::string& name, const std::string& in, double batch, double cin,
                   double cout, int k, int stride, int h, int* h_out, double x_amax = 6.0) {
    const int ho = (h + 2 * (k / 2) - k) / stride + 1;
    op o;
    o.name = name;
    o.kind = op_kind::conv;
    o.inputs = {in};
    const double in_numel = batch * cin * h * h, out_numel = batch * cout * ho * ho;
    o.param_numel = cout * cin * k * k;
    o.flops = 2.0 * out_numel * cin * k * k;
    o.bytes = 4.0 * (in_numel + out_numel + o.param_numel);
    o.output_numel = out_numel;
    o.saved_numel = in_numel;
    estimate_stats(o, cin * k * k, in_numel, x_amax);
    *h_out = ho;
    return add(std::move(o));
  }

  // An elementwise or normalisation op over `numel` elements; `params` for norms.
  std::string pointwise(const std::string& name, op_kind kind, std::vector<std::string> in,
                        double numel, double saved, double params = 0, double flops_per = 1) {
    op o;
    o.name = name;
    o.kind = kind;
    o.inputs = std::move(in);
    o.param_numel = params;
    o.flops = flops_per * numel;
    o.bytes = 4.0 * numel * (1.0 + static_cast<double>(o.inputs.size()));
    o.output_numel = numel;
    o.saved_numel = saved;
    if (params > 0) {
      estimate_stats(o, 1.0, numel);
      o.stats.weight_norm = std::sqrt(params / 2.0);  // gamma = 1, beta = 0
      o.stats.weight_absmax = 1.0;
    }
    return add(std::move(o));
  }

  // Linear layer with bias on `rows` rows; saves its input unless told otherwise.
  std::string linear(const std::string& name, const std::string& in, double rows, double fin,
                     double fout, bool saves_input = true) {
    op o;
    o.name = name;
    o.kind = op_kind::linear;
    o.inputs = {in};
    o.param_numel = fin * fout + fout;
    o.flops = 2.0 * rows * fin * fout;
    o.bytes = 4.0 * (rows * fin + rows * fout + o.param_numel);
    o.output_numel = rows * fout;
    o.saved_numel = saves_input ? rows * fin : 0.0;
    estimate_stats(o, fin, rows * fin);
    o.stats.weight_absmax = 4.0 * std::sqrt(1.0 / fin);
    o.stats.weight_norm = std::sqrt(1.0 / fin) * std::sqrt(o.param_numel);
    return add(std::move(o));
  }
};

}  // namespace detail

/// ResNet-50 (torchvision v1.5 layout: stride on the 3x3 conv) on 224x224 images,
/// `batch` images per GPU, trained with momentum SGD. Conv, batch norm and ReLU are
/// separate ops, as the profiler sees them.
inline training_model resnet50(int batch = 32) {
  LOWBIT_EXPECTS(batch >= 1, "batch must be at least 1");
  const double b = batch;
  detail::graph_builder gb;
  int h = 224;
  std::string x = gb.conv("conv1", "", b, 3, 64, 7, 2, h, &h, 2.7);
  gb.ops.back().inputs.clear();  // the image is the graph's input
  double numel = b * 64 * h * h;
  x = gb.pointwise("bn1", op_kind::batch_norm, {x}, numel, numel, 128, 4);
  x = gb.pointwise("relu", op_kind::relu, {x}, numel, numel);
  h = (h + 2 - 3) / 2 + 1;
  {
    op pool;
    pool.name = "maxpool";
    pool.kind = op_kind::pool;
    pool.inputs = {x};
    pool.output_numel = b * 64 * h * h;
    pool.flops = 9.0 * pool.output_numel;
    pool.bytes = 4.0 * (numel + pool.output_numel);
    pool.saved_numel = numel;
    x = gb.add(std::move(pool));
  }
  double cin = 64;
  const int blocks[] = {3, 4, 6, 3};
  const double widths[] = {64, 128, 256, 512};
  for (int stage = 0; stage < 4; ++stage) {
    for (int blk = 0; blk < blocks[stage]; ++blk) {
      const std::string p = "layer" + std::to_string(stage + 1) + "." + std::to_string(blk) + ".";
      const double w = widths[stage], cout = 4 * w;
      const int stride = (blk == 0 && stage > 0) ? 2 : 1;
      const std::string identity = x;
      int h1 = h, h2 = h, h3 = h;
      std::string y = gb.conv(p + "conv1", x, b, cin, w, 1, 1, h, &h1);
      y = gb.pointwise(p + "bn1", op_kind::batch_norm, {y}, b * w * h1 * h1, b * w * h1 * h1, 2 * w,
                       4);
      y = gb.pointwise(p + "relu1", op_kind::relu, {y}, b * w * h1 * h1, b * w * h1 * h1);
      y = gb.conv(p + "conv2", y, b, w, w, 3, stride, h1, &h2);
      y = gb.pointwise(p + "bn2", op_kind::batch_norm, {y}, b * w * h2 * h2, b * w * h2 * h2, 2 * w,
                       4);
      y = gb.pointwise(p + "relu2", op_kind::relu, {y}, b * w * h2 * h2, b * w * h2 * h2);
      y = gb.conv(p + "conv3", y, b, w, cout, 1, 1, h2, &h3);
      const double out = b * cout * h3 * h3;
      y = gb.pointwise(p + "bn3", op_kind::batch_norm, {y}, out, out, 2 * cout, 4);
      std::string skip = identity;
      if (blk == 0) {
        int hd = h;
        skip = gb.conv(p + "downsample.conv", identity, b, cin, cout, 1, stride, h, &hd);
        skip =
            gb.pointwise(p + "downsample.bn", op_kind::batch_norm, {skip}, out, out, 2 * cout, 4);
      }
      y = gb.pointwise(p + "add", op_kind::add, {y, skip}, out, 0);
      x = gb.pointwise(p + "relu3", op_kind::relu, {y}, out, out);
      cin = cout;
      h = h3;
    }
  }
  {
    op pool;
    pool.name = "avgpool";
    pool.kind = op_kind::pool;
    pool.inputs = {x};
    pool.output_numel = b * cin;
    pool.flops = b * cin * h * h;
    pool.bytes = 4.0 * (b * cin * h * h + b * cin);
    x = gb.add(std::move(pool));
  }
  x = gb.linear("fc", x, b, 2048, 1000);
  gb.pointwise("loss", op_kind::loss, {x}, b * 1000, b * 1000, 0, 5);
  training_model m;
  m.name = "resnet50";
  m.graph = op_graph(std::move(gb.ops));
  m.optimizer_bytes_per_param = 4.0;  // SGD momentum
  return m;
}

/// BERT-base (12 layers, hidden 768, 12 heads, FFN 3072, vocabulary 30522) fine-tuned
/// for classification: `batch` sequences of `seq` tokens per GPU, Adam. Q, K and V
/// share one saved input (counted on Q); the scores' softmax output is saved once.
inline training_model bert_base(int batch = 8, int seq = 384) {
  LOWBIT_EXPECTS(batch >= 1 && seq >= 1 && seq <= 512, "batch >= 1 and 1 <= seq <= 512");
  const double b = batch, s = seq, t = b * s, hid = 768, heads = 12, ffn = 3072;
  detail::graph_builder gb;
  std::string x;
  {
    op e;
    e.name = "embeddings";
    e.kind = op_kind::embedding;
    e.param_numel = (30522 + 512 + 2) * hid;
    e.output_numel = t * hid;
    e.flops = 3.0 * t * hid;
    e.bytes = 4.0 * 4.0 * t * hid;
    detail::estimate_stats(e, 1.0, 0.0);
    e.stats.weight_absmax = 0.1;  // N(0, 0.02) init
    e.stats.weight_norm = 0.02 * std::sqrt(e.param_numel);
    x = gb.add(std::move(e));
  }
  x = gb.pointwise("embeddings.ln", op_kind::layer_norm, {x}, t * hid, t * hid, 2 * hid, 5);
  const double att = b * heads * s * s;
  for (int l = 0; l < 12; ++l) {
    const std::string p = "encoder." + std::to_string(l) + ".";
    const std::string in = x;
    const std::string q = gb.linear(p + "query", in, t, hid, hid);
    const std::string k = gb.linear(p + "key", in, t, hid, hid, false);
    const std::string v = gb.linear(p + "value", in, t, hid, hid, false);
    op sc;
    sc.name = p + "scores";
    sc.kind = op_kind::matmul;
    sc.inputs = {q, k};
    sc.flops = 2.0 * att * (hid / heads);
    sc.output_numel = att;
    sc.bytes = 4.0 * (2 * t * hid + att);
    sc.saved_numel = 2 * t * hid;
    std::string y = gb.add(std::move(sc));
    y = gb.pointwise(p + "softmax", op_kind::softmax, {y}, att, att, 0, 5);
    op cx;
    cx.name = p + "context";
    cx.kind = op_kind::matmul;
    cx.inputs = {y, v};
    cx.flops = 2.0 * att * (hid / heads);
    cx.output_numel = t * hid;
    cx.bytes = 4.0 * (att + 2 * t * hid);
    cx.saved_numel = t * hid;
    y = gb.add(std::move(cx));
    y = gb.linear(p + "attention.output", y, t, hid, hid);
    y = gb.pointwise(p + "attention.add", op_kind::add, {y, in}, t * hid, 0);
    const std::string a =
        gb.pointwise(p + "attention.ln", op_kind::layer_norm, {y}, t * hid, t * hid, 2 * hid, 5);
    y = gb.linear(p + "intermediate", a, t, hid, ffn);
    y = gb.pointwise(p + "gelu", op_kind::gelu, {y}, t * ffn, t * ffn, 0, 8);
    y = gb.linear(p + "output", y, t, ffn, hid);
    y = gb.pointwise(p + "output.add", op_kind::add, {y, a}, t * hid, 0);
    x = gb.pointwise(p + "output.ln", op_kind::layer_norm, {y}, t * hid, t * hid, 2 * hid, 5);
  }
  x = gb.linear("pooler", x, b, hid, hid);
  x = gb.linear("classifier", x, b, hid, 2);
  gb.pointwise("loss", op_kind::loss, {x}, b * 2, b * 2, 0, 5);
  training_model m;
  m.name = "bert-base";
  m.graph = op_graph(std::move(gb.ops));
  m.optimizer_bytes_per_param = 8.0;  // Adam
  return m;
}

/// 4x T4 + 4x V100 over 25 Gb/s Ethernet: QSync's hybrid setting.
inline cluster t4_v100_cluster() {
  return {"t4v100", {{t4(), 4, {}}, {v100(), 4, {}}}, builtin_link("ethernet-25g")};
}

/// 2x H200 over NVLink 4.
inline cluster h200_x2_cluster() { return {"h200x2", {{h200(), 2, {}}}, builtin_link("nvlink4")}; }

/// Names accepted by builtin_model and builtin_cluster.
inline std::vector<std::string> builtin_model_names() { return {"resnet50", "bert-base"}; }
/// See builtin_model_names.
inline std::vector<std::string> builtin_cluster_names() { return {"t4v100", "h200x2"}; }

/// A built-in model by name, at its default batch.
inline training_model builtin_model(const std::string& name) {
  if (name == "resnet50") return resnet50();
  if (name == "bert-base") return bert_base();
  LOWBIT_EXPECTS(false, "unknown model '" + name + "' (built-ins: resnet50, bert-base)");
  return {};
}

/// A built-in cluster by name; a built-in device's name (`H200`) is one such device
/// alone, the single-GPU training that profiles are validated on.
inline cluster builtin_cluster(const std::string& name) {
  if (name == "t4v100") return t4_v100_cluster();
  if (name == "h200x2") return h200_x2_cluster();
  for (const auto& d : builtin_device_names())
    if (name == d) return {"1x " + d, {{builtin_device(d), 1, {}}}, builtin_link("nvlink4")};
  LOWBIT_EXPECTS(false, "unknown cluster '" + name +
                            "' (built-ins: t4v100, h200x2, or one device: T4, V100, A100, H100, "
                            "H200)");
  return {};
}

}  // namespace lowbit::qsync
