// The QSync planner with its JSON side (qsync/plan_io.hpp), host-only: a small model and
// cluster read from JSON, a plan allocated under a target and written back as JSON.
// Built against an installed lowbit by scripts/test.
#include <cstdio>
#include <string>
#include <vector>

#include <lowbit/qsync/qsync.hpp>
#include <nlohmann/json.hpp>

int main() {
  using namespace lowbit::qsync;
  const auto model = model_from_json(nlohmann::json::parse(R"({
    "name": "two-layer mlp", "optimizer_bytes_per_param": 4,
    "ops": [
      {"name": "fc1", "kind": "linear", "flops": 2.7e8, "bytes": 5.3e6, "output_numel": 524288,
       "saved_numel": 262144, "param_numel": 262656, "inputs": []},
      {"name": "relu", "kind": "relu", "flops": 524288, "bytes": 4.2e6, "output_numel": 524288,
       "saved_numel": 524288, "inputs": ["fc1"]},
      {"name": "fc2", "kind": "linear", "flops": 1.1e6, "bytes": 2.1e6, "output_numel": 1024,
       "saved_numel": 524288, "param_numel": 1026, "inputs": ["relu"]}]})"));
  const auto hw = cluster_from_json(nlohmann::json::parse(R"({
    "name": "2x T4 + 2x V100", "link": "ethernet-25g",
    "groups": [{"device": "T4", "count": 2}, {"device": "V100", "count": 2}]})"),
                                    model.graph);

  const simulator sim(model, hw);
  const std::vector<int> bits = {4, 8, 16, 32};
  const allocation_problem pb(sim, indicator_scores(sim, bits), bits, default_target_ms(sim, bits));
  const allocation a = greedy_allocate(pb);

  const nlohmann::ordered_json plan = plan_to_json(sim, a);
  std::printf("qsync plan for %s on %s: %.3f ms (target %.3f ms)\n",
              plan["model"].get<std::string>().c_str(), plan["cluster"].get<std::string>().c_str(),
              plan["predicted_iteration_ms"].get<double>(), plan["target_ms"].get<double>());
  for (const auto& g : plan["groups"])
    std::printf("  %s: %s\n", g["device"].get<std::string>().c_str(), g["ops"].dump().c_str());
  for (const auto& b : plan["buckets"])
    std::printf("  bucket %s: %d bits\n", b["ops"].dump().c_str(), b["bits"].get<int>());
  return plan["groups"].size() == 2 && !plan["buckets"].empty() ? 0 : 1;
}
