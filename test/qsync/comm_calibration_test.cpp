// Bucket all-reduce times from lowbit-perf's measured rows (lowbit/qsync/comm_calibration.hpp):
// a measured size is reproduced, sizes between are interpolated in log(bytes), everything
// the table cannot answer goes to the analytic model and is counted, a malformed file is
// refused at its line; and a planner given the table plans with the measured times.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "lowbit/qsync/allocator.hpp"
#include "lowbit/qsync/comm_calibration.hpp"
#include "lowbit/qsync/comm_model.hpp"
#include "lowbit/qsync/simulator.hpp"
#include "qsync_fixtures.hpp"

using namespace lowbit::qsync;
using Catch::Matchers::Contains;

namespace {

// Rows copied from docs/perf/perf-2026-11-30d.csv (2x H200): nvlink float and bfloat16
// 4-bit all_reduce at 1 MiB .. 1 GiB, a second header, a residual_bf16 row and an
// all_gather row (both skipped), three pcie float rows.
const std::string fixture = std::string(LOWBIT_TEST_DATA_DIR) + "/qsync_perf_calibration.csv";

const std::string header =
    "regime,coll,type,op,bits,feedback,schedule,ranks,bytes,count,lowbit_us,lowbit_busbw,"
    "nccl_us,nccl_busbw,speedup,wire_ratio,rel_err,wrong,algorithm,transport\n";

/// Writes `text` to `name` in the temporary directory; returns the path.
std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path) << text;
  return path;
}

link_profile nvlink() { return builtin_link("nvlink4"); }

}  // namespace

TEST_CASE("a measured size is reproduced exactly, at every width the table prices") {
  const comm_calibration c = load_comm_calibration(fixture, {"nvlink"});
  CHECK(c.regime() == "nvlink");
  std::string why;
  // 4-bit: lowbit_us of the float row of 16 MiB (4194304 values).
  CHECK(c.measured_ms(4, 4194304, 2, why) == Approx(0.031712).epsilon(1e-12));
  // 32: that row's nccl_us; 16: the bfloat16 row of the same count's nccl_us.
  CHECK(c.measured_ms(32, 4194304, 2, why) == Approx(0.080544).epsilon(1e-12));
  CHECK(c.measured_ms(16, 8388608, 2, why) == Approx(0.080448).epsilon(1e-12));
  CHECK(c.measured_ms(32, 262144, 2, why) == Approx(0.016896).epsilon(1e-12));    // smallest
  CHECK(c.measured_ms(4, 268435456, 2, why) == Approx(0.766368).epsilon(1e-12));  // largest
  CHECK(why.empty());
  // The residual_bf16 row at 16 MiB (lowbit 61.440, NCCL 79.744) is not averaged in.
  CHECK(c.measured_ms(16, 8388608, 2, why) == Approx(0.080448).epsilon(1e-12));

  const device_profile dev = h200();
  const calibrated_time t4 = c.all_reduce(4, 4194304, 2, nvlink(), dev);
  CHECK(t4.from_table);
  CHECK(t4.fallback.empty());
  CHECK(t4.ms == Approx(0.031712).epsilon(1e-12));
  // bf16: the collective measured plus the two casts around it, which it does not hold.
  const calibrated_time t16 = c.all_reduce(16, 8388608, 2, nvlink(), dev);
  CHECK(t16.ms == Approx(0.080448 + codec_ms(16, 8388608, 2, dev)).epsilon(1e-12));
  CHECK(codec_ms(16, 8388608, 2, dev) > 0);
  CHECK(c.lookups() == 2);
  CHECK(c.fallbacks() == 0);
}

TEST_CASE("between two measured sizes: linear in log(bytes), monotone, within the two") {
  const comm_calibration c = load_comm_calibration(fixture, {"nvlink"});
  std::string why;
  // 4 MiB (23.392 us) and 16 MiB (31.712 us) of float at 4 bits; 8 MiB is halfway in log.
  CHECK(c.measured_ms(4, 2097152, 2, why) == Approx(0.5 * (0.023392 + 0.031712)));
  double last = c.measured_ms(4, 1048576, 2, why);
  CHECK(last == Approx(0.023392));
  for (double n = 1048576 * 1.05; n < 4194304; n *= 1.05) {
    const double ms = c.measured_ms(4, n, 2, why);
    INFO("count " << n);
    CHECK(ms > last);
    CHECK(ms < 0.031712);
    last = ms;
  }
  CHECK(why.empty());
}

TEST_CASE("outside the measured range or not measured: the analytic model, counted") {
  const comm_calibration c = load_comm_calibration(fixture, {"nvlink"});
  const device_profile dev = h200();
  const link_profile link = nvlink();

  const calibrated_time big = c.all_reduce(4, 536870912, 2, link, dev);  // 2 GiB of float
  CHECK_FALSE(big.from_table);
  CHECK_THAT(big.fallback, Contains("outside the 1 MiB .. 1024 MiB measured"));
  CHECK(big.ms == Approx(all_reduce_ms(4, 536870912, 2, link, dev)));
  const calibrated_time small = c.all_reduce(32, 1000, 2, link, dev);
  CHECK_FALSE(small.from_table);
  CHECK(small.ms == Approx(all_reduce_ms(32, 1000, 2, link, dev)));

  const calibrated_time wide = c.all_reduce(8, 4194304, 2, link, dev);
  CHECK_FALSE(wide.from_table);
  CHECK_THAT(wide.fallback, Contains("no float rows at 8 bits on 2 ranks"));
  const calibrated_time four = c.all_reduce(4, 4194304, 4, link, dev);
  CHECK_FALSE(four.from_table);
  CHECK_THAT(four.fallback, Contains("no rows on 4 ranks (measured on 2)"));
  CHECK(four.ms == Approx(all_reduce_ms(4, 4194304, 4, link, dev)));

  CHECK(c.all_reduce(4, 4194304, 1, link, dev).ms == 0.0);  // one rank: no lookup
  CHECK(c.lookups() == 4);
  CHECK(c.fallbacks() == 4);
  CHECK(c.fallbacks(4) == 2);
  CHECK(c.fallbacks(8) == 1);
  CHECK(c.fallbacks(32) == 1);
  CHECK(c.fallbacks(16) == 0);
  c.all_reduce(4, 4194304, 2, link, dev);
  CHECK(c.lookups() == 5);
  CHECK(c.fallbacks() == 4);
  c.reset_counts();
  CHECK(c.fallbacks() == 0);
  CHECK(c.fallbacks(4) == 0);
}

TEST_CASE("the regime picks the link class, and with several one must be named") {
  const comm_calibration pcie = load_comm_calibration(fixture, {"pcie"});
  std::string why;
  CHECK(pcie.measured_ms(4, 1048576, 2, why) == Approx(0.054656));
  CHECK(pcie.measured_ms(32, 4194304, 2, why) == Approx(0.631264));
  CHECK(pcie.measured_ms(4, 16777216, 2, why) < 0);  // beyond its 16 MiB
  CHECK_THAT(why, Contains("outside"));
  CHECK(pcie.measured_ms(16, 1048576, 2, why) < 0);  // no bfloat16 rows there
  CHECK_THAT(why, Contains("no bfloat16 rows for the plain 16-bit all-reduce"));

  REQUIRE_THROWS_WITH(load_comm_calibration(fixture),
                      Contains("several regimes (nvlink, pcie); name one"));
  REQUIRE_THROWS_WITH(load_comm_calibration(fixture, {"net"}),
                      Contains("no all_reduce rows of regime 'net' (there are nvlink, pcie)"));
  const std::string one = write_file("calib_one_regime.csv", header +
                                                                 "net,all_reduce,float,sum,2,none,"
                                                                 "default,2,1048576,262144,11958."
                                                                 "048,0.1,15999.136,0.1,1,1,0,0,"
                                                                 "one_shot,nccl_symmetric\n");
  CHECK(load_comm_calibration(one).regime() == "net");
}

TEST_CASE("a malformed table is refused at its file:line") {
  const std::string row =
      "nvlink,all_reduce,float,sum,4,none,default,2,1048576,262144,18.784,55.823,16.896,62.061,"
      "0.8995,7.5294,1.229e-01,0,one_shot,copy_engines\n";
  using lowbit::invalid_argument;
  const std::string no_col = write_file(
      "calib_no_column.csv", "regime,coll,type,op,bits,feedback,schedule,ranks,count\n" + row);
  REQUIRE_THROWS_AS(load_comm_calibration(no_col), invalid_argument);
  REQUIRE_THROWS_WITH(load_comm_calibration(no_col),
                      Contains(no_col + ":1: header lacks column(s) bytes, lowbit_us, nccl_us"));

  std::string bad = row;
  bad.replace(bad.find("18.784"), 6, "18.7x4");
  const std::string not_number = write_file("calib_not_number.csv", header + row + bad);
  REQUIRE_THROWS_WITH(load_comm_calibration(not_number),
                      Contains(not_number + ":3: column 'lowbit_us' is not a number: '18.7x4'"));

  const std::string short_row =
      write_file("calib_short_row.csv", header + "\n" + row.substr(0, row.rfind(',')) + "\n");
  REQUIRE_THROWS_WITH(load_comm_calibration(short_row),
                      Contains(short_row + ":3: 19 fields, the header has 20"));

  const std::string no_header = write_file("calib_no_header.csv", row);
  REQUIRE_THROWS_WITH(load_comm_calibration(no_header), Contains(no_header + ":1: a row before"));

  std::string zero = row;
  zero.replace(zero.find("16.896"), 6, "0");
  const std::string zero_time = write_file("calib_zero_time.csv", header + zero);
  REQUIRE_THROWS_WITH(load_comm_calibration(zero_time), Contains(zero_time + ":2: bytes,"));

  REQUIRE_THROWS_WITH(load_comm_calibration("no/such/table.csv"),
                      Contains("cannot read calibration table 'no/such/table.csv'"));
}

// One op of 4M parameters: one 16 MiB fp32 bucket, ready when backward ends, so its
// all-reduce is all on the critical path. The op runs at fp32 only, so the bucket's bits
// are the one decision. On nvlink4 the model prices fp32 below 4 bits (the codec's
// passes over HBM cost more than the wire saves); the table measured fp32 NCCL at 80.5 us
// against lowbit's 4-bit 31.7 us. A target that the table's fp32 time misses and every
// time the model predicts meets has the planner keep fp32 under the model and compress
// under the table.
TEST_CASE("the table, not the model, decides a bucket on the critical path") {
  using namespace lowbit::qsync::test;
  device_profile d = round_device("H", 16);
  d.precisions = {precision::fp32};
  op fc = linear_op("fc", {}, 4194304);
  fc.stats.grad_weight_norm = 1.0;  // else every bucket width scores 0 and none is chosen
  const training_model m = model_of({fc}, 25, 25);
  const cluster analytic{"two", {{d, 2, {}}}, nvlink()};
  cluster measured = analytic;
  measured.calibration =
      std::make_shared<const comm_calibration>(load_comm_calibration(fixture, {"nvlink"}));
  const simulator model_sim(m, analytic), table_sim(m, measured);
  REQUIRE(table_sim.buckets().size() == 1);
  REQUIRE(table_sim.buckets()[0].numel == 4194304);

  CHECK(table_sim.bucket_ms(0, 0, 4) == Approx(0.031712));
  CHECK(table_sim.bucket_ms(0, 0, 32) == Approx(0.080544));
  CHECK(model_sim.bucket_ms(0, 0, 32) < model_sim.bucket_ms(0, 0, 4));
  CHECK(model_sim.bucket_ms(0, 0, 32) < table_sim.bucket_ms(0, 0, 32));

  const std::vector<int> bits = {4, 32};
  const double t4 = table_sim.evaluate(table_sim.uniform(precision::fp32, 4)).iteration_ms();
  const double t32 = table_sim.evaluate(table_sim.uniform(precision::fp32, 32)).iteration_ms();
  REQUIRE(t4 < t32);
  // Below the table's fp32 time, above every time the model predicts.
  const double target = t32 - 0.25 * (t32 - t4);
  for (int b : bits)
    REQUIRE(model_sim.evaluate(model_sim.uniform(precision::fp32, b)).iteration_ms() < target);

  measured.calibration->reset_counts();
  const allocation by_model =
      greedy_allocate({model_sim, indicator_scores(model_sim, bits), bits, target});
  const allocation by_table =
      greedy_allocate({table_sim, indicator_scores(table_sim, bits), bits, target});
  CHECK(by_model.target_met);
  CHECK(by_table.target_met);
  CHECK(by_model.result.bucket_bits == std::vector<int>{32});
  CHECK(by_table.result.bucket_bits == std::vector<int>{4});
  CHECK(by_table.eval.iteration_ms() == Approx(t4));
  CHECK(measured.calibration->lookups() > 0);
  CHECK(measured.calibration->fallbacks() == 0);
}

TEST_CASE("a hierarchical cluster keeps the analytic model and asks the table nothing") {
  using namespace lowbit::qsync::test;
  device_profile d = round_device("H", 16);
  const training_model m = model_of({linear_op("fc", {}, 4194304)}, 25, 25);
  cluster hw{"two nodes", {{d, 4, {}}}, nvlink()};
  hw.ranks_per_node = 2;
  hw.inter_link = builtin_link("ib-ndr");
  const simulator plain(m, hw);
  hw.calibration =
      std::make_shared<const comm_calibration>(load_comm_calibration(fixture, {"nvlink"}));
  const simulator calibrated(m, hw);
  CHECK(calibrated.bucket_ms(0, 0, 4) == plain.bucket_ms(0, 0, 4));
  CHECK(hw.calibration->lookups() == 0);
}
