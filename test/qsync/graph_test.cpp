#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "lowbit/qsync/models.hpp"
#include "lowbit/qsync/op_graph.hpp"

using namespace lowbit::qsync;
using Catch::Matchers::Contains;

namespace {
op make(std::string name, std::vector<std::string> inputs, double params = 0) {
  op o;
  o.name = std::move(name);
  o.kind = params > 0 ? op_kind::linear : op_kind::relu;
  o.inputs = std::move(inputs);
  o.param_numel = params;
  return o;
}
}  // namespace

TEST_CASE("op_graph: topological order is stable and depth follows it") {
  const op_graph g({make("c", {"a", "b"}), make("a", {}), make("b", {"a"})});
  REQUIRE(g.topo_order() == std::vector<std::size_t>{1, 2, 0});
  REQUIRE(g.depth(0) == 2);
  REQUIRE(g.producers(0) == std::vector<std::size_t>{1, 2});
  REQUIRE(g.consumers(1) == std::vector<std::size_t>{0, 2});
  REQUIRE(g.index_of("b") == 2);
}

TEST_CASE("op_graph: unknown input, cycle and duplicate names are errors naming the op") {
  REQUIRE_THROWS_WITH(op_graph({make("a", {}), make("b", {"nope"})}),
                      Contains("op 'b' has unknown input op 'nope'"));
  REQUIRE_THROWS_WITH(
      op_graph({make("x", {}), make("a", {"c"}), make("b", {"a"}), make("c", {"b", "x"})}),
      Contains("cycle in the op graph") && Contains("'a' -> 'b'") && Contains("'c'"));
  REQUIRE_THROWS_WITH(op_graph({make("self", {"self"})}),
                      Contains("cycle") && Contains("'self' -> 'self'"));
  REQUIRE_THROWS_WITH(op_graph({make("a", {}), make("a", {})}), Contains("duplicate op name 'a'"));
  const op_graph g({make("a", {})});
  REQUIRE_THROWS_WITH(g.index_of("zz"), Contains("unknown op 'zz'"));
}

TEST_CASE("make_buckets: reverse order of production, first bucket capped smaller") {
  // 1 MiB of fp32 = 262144 elements.
  const double mib = 262144;
  const op_graph g({make("a", {}, 2 * mib), make("r", {"a"}), make("b", {"r"}, 0.5 * mib),
                    make("c", {"b"}, 0.75 * mib), make("d", {"c"}, 3 * mib)});
  const auto buckets = make_buckets(g, 4.0, 1.0);
  REQUIRE(buckets.size() == 2);
  REQUIRE(buckets[0].ops == std::vector<std::size_t>{4});  // d alone passes 1 MiB
  REQUIRE(buckets[1].ops == std::vector<std::size_t>{3, 2, 0});
  REQUIRE(buckets[1].numel == Approx(3.25 * mib));
}

TEST_CASE("built-in models have their real sizes") {
  const auto r = resnet50(32);
  // torchvision ResNet-50: 25,557,032 parameters including BN gamma/beta.
  REQUIRE(r.graph.total_params() == Approx(25557032));
  double flops = 0;
  for (const auto& o : r.graph.ops())
    if (o.kind == op_kind::conv || o.kind == op_kind::linear) flops += o.flops;
  // About 4.1 GMACs per 224x224 image.
  REQUIRE(flops / 32 / 2 == Approx(4.09e9).epsilon(0.02));
  const auto b = bert_base(8, 384);
  // BERT-base encoder + embeddings + pooler, 109.5M, plus a 2-way classifier.
  REQUIRE(b.graph.total_params() == Approx(109483778).epsilon(1e-6));
  REQUIRE(b.graph.at(b.graph.index_of("encoder.11.output.ln")).kind == op_kind::layer_norm);
}
