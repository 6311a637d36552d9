// Bucket all-reduce times taken from a table measured on the communicator's own links
// (lowbit-perf's --csv rows) instead of the analytic communication model, with every
// lookup the table cannot answer priced by the model and counted.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lowbit/core/error.hpp"
#include "lowbit/qsync/comm_model.hpp"
#include "lowbit/qsync/device_profile.hpp"

namespace lowbit::qsync {

/// Bytes of one element of a lowbit-perf datatype (its -d names: float, bfloat16, half);
/// 0 for a name it does not know.
inline double element_bytes(const std::string& type) {
  if (type == "float") return 4.0;
  if (type == "bfloat16" || type == "half") return 2.0;
  return 0.0;
}

/// One measured curve: all-reduce time against uncompressed bytes (count * element
/// size, as lowbit-perf's bytes column), `bytes` ascending and distinct.
struct calibration_series {
  std::vector<double> bytes;
  std::vector<double> ms;
};

/// A bucket's all-reduce time and where it came from.
struct calibrated_time {
  double ms = 0.0;
  bool from_table = false;  ///< interpolated in the table, else the analytic model's
  std::string fallback;     ///< why the model priced it; empty when from the table
};

/// Which rows of a lowbit-perf CSV a calibration keeps, besides coll == all_reduce.
struct calibration_filter {
  std::string regime;             ///< the regime column (link class); empty: the only one
  std::string feedback = "none";  ///< the feedback column
};

/// All-reduce times measured by lowbit-perf on one link class, per (ranks, bits, type):
/// lowbit's collective (lowbit_us) at its code width, and the plain NCCL all-reduce of the
/// same rows (nccl_us) as width 32 (float rows) or 16 (bfloat16 and half rows). Rows at
/// the same size (repeated runs, or other algorithms and transports) are combined by the
/// median of their times. Move-only: it counts its lookups, which a simulator's copies of
/// a cluster share through a shared_ptr.
class comm_calibration {
 public:
  /// An empty table for `file`'s `regime` (the names are for messages); add() fills it.
  comm_calibration(std::string file, std::string regime)
      : file_(std::move(file)), regime_(std::move(regime)), counts_(new counts) {}
  comm_calibration(comm_calibration&&) noexcept = default;
  comm_calibration& operator=(comm_calibration&&) noexcept = default;

  /// Adds one measurement: the all-reduce of `bytes` on `ranks` ranks at `bits` of `type`
  /// (bits 16 or 32 with the element type: the plain collective) took `us` microseconds.
  /// Call finish() after the last one.
  void add(int ranks, int bits, const std::string& type, double bytes, double us) {
    raw_[{ranks, bits, type}][bytes].push_back(us / 1000.0);
  }

  /// Combines the measurements added into the series that lookups interpolate.
  void finish() {
    series_.clear();
    for (auto& [key, points] : raw_) {
      calibration_series s;
      for (auto& [bytes, ms] : points) {
        std::sort(ms.begin(), ms.end());
        const std::size_t n = ms.size();
        s.bytes.push_back(bytes);
        s.ms.push_back(n % 2 == 1 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]));
      }
      series_.emplace(key, std::move(s));
    }
  }

  /// The file the table was read from.
  const std::string& file() const noexcept { return file_; }
  /// The regime (link class) its rows were measured on.
  const std::string& regime() const noexcept { return regime_; }
  /// Measured series, one per (ranks, bits, type).
  std::size_t series_count() const noexcept { return series_.size(); }

  /// The series for `ranks` ranks at `bits` of `type`, or null when none was measured.
  const calibration_series* series(int ranks, int bits, const std::string& type) const {
    const auto it = series_.find({ranks, bits, type});
    return it == series_.end() ? nullptr : &it->second;
  }

  /// The element type a planner's width reads from the table: gradients are fp32, so a
  /// coded width and 32 are float rows; 16 is the plain bf16 all-reduce.
  static std::string type_for_bits(int bits) { return bits == 16 ? "bfloat16" : "float"; }

  /// Measured milliseconds of one all-reduce of `count` fp32 gradients at `bits` on
  /// `ranks` ranks, interpolated linearly in log(bytes) between the two measured sizes
  /// around count * element size (a measured size exactly); a negative value, with the
  /// reason in `why`, when no series matches or the size is outside its measured range.
  /// The table's bf16 time is the collective's alone, without the casts around it.
  double measured_ms(int bits, double count, int ranks, std::string& why) const {
    const std::string type = type_for_bits(bits);
    const calibration_series* s = series(ranks, bits, type);
    if (s == nullptr) {
      why = no_series_reason(ranks, bits, type);
      return -1.0;
    }
    const double bytes = count * element_bytes(type);
    if (bytes < s->bytes.front() || bytes > s->bytes.back()) {
      why = std::to_string(bits) + "-bit buckets of " + bytes_text(bytes) + " are outside the " +
            bytes_text(s->bytes.front()) + " .. " + bytes_text(s->bytes.back()) + " measured";
      return -1.0;
    }
    const auto hi = std::lower_bound(s->bytes.begin(), s->bytes.end(), bytes);
    const std::size_t j = static_cast<std::size_t>(hi - s->bytes.begin());
    if (*hi == bytes || j == 0) return s->ms[j];
    const double x0 = std::log(s->bytes[j - 1]), x1 = std::log(s->bytes[j]);
    const double w = (std::log(bytes) - x0) / (x1 - x0);
    return s->ms[j - 1] + w * (s->ms[j] - s->ms[j - 1]);
  }

  /// Milliseconds of a flat all-reduce of `count` fp32 gradients at `bits` on `ranks`
  /// ranks: the table's (at 16 bits plus the two casts of codec_ms), else all_reduce_ms
  /// on `link` and `dev` with the reason, counted in fallbacks(). One rank or nothing to
  /// send costs nothing and is no lookup.
  calibrated_time all_reduce(int bits, double count, int ranks, const link_profile& link,
                             const device_profile& dev) const {
    calibrated_time t;
    LOWBIT_EXPECTS(bits >= 1 && (bits <= 16 || bits == 32),
                   "communication bits must be 1..16 or 32, got " + std::to_string(bits));
    if (ranks == 1 || count <= 0) return t;
    counts_->lookups.fetch_add(1, std::memory_order_relaxed);
    const double ms = measured_ms(bits, count, ranks, t.fallback);
    if (ms >= 0) {
      t.ms = bits == 16 ? ms + codec_ms(16, count, ranks, dev) : ms;
      t.from_table = true;
      return t;
    }
    counts_->fallbacks.fetch_add(1, std::memory_order_relaxed);
    counts_->by_bits[static_cast<std::size_t>(bits)].fetch_add(1, std::memory_order_relaxed);
    t.ms = all_reduce_ms(bits, count, ranks, link, dev);
    return t;
  }

  /// Lookups all_reduce() answered (from the table or not) since the last reset_counts().
  std::size_t lookups() const noexcept { return counts_->lookups.load(); }
  /// Lookups the analytic model answered for lack of a measurement.
  std::size_t fallbacks() const noexcept { return counts_->fallbacks.load(); }
  /// Of those, the lookups at `bits` (1..16 or 32).
  std::size_t fallbacks(int bits) const {
    LOWBIT_EXPECTS(bits >= 0 && bits <= 32, "bits must be 1..16 or 32");
    return counts_->by_bits[static_cast<std::size_t>(bits)].load();
  }
  /// Sets the counts to zero.
  void reset_counts() const noexcept {
    counts_->lookups = 0;
    counts_->fallbacks = 0;
    for (auto& n : counts_->by_bits) n = 0;
  }

 private:
  struct counts {
    std::atomic<std::size_t> lookups{0}, fallbacks{0};
    std::array<std::atomic<std::size_t>, 33> by_bits{};
  };
  using key = std::tuple<int, int, std::string>;  // ranks, bits, type

  static std::string bytes_text(double b) {
    std::ostringstream os;
    os.precision(4);
    if (b >= 1048576.0)
      os << b / 1048576.0 << " MiB";
    else
      os << b / 1024.0 << " KiB";
    return os.str();
  }

  std::string no_series_reason(int ranks, int bits, const std::string& type) const {
    std::set<int> ranks_seen;
    for (const auto& [k, s] : series_) ranks_seen.insert(std::get<0>(k));
    if (ranks_seen.count(ranks) == 0) {
      std::string seen;
      for (int r : ranks_seen) seen += (seen.empty() ? "" : ", ") + std::to_string(r);
      return "no rows on " + std::to_string(ranks) + " ranks (measured on " + seen + ")";
    }
    if (bits == 16 || bits == 32)
      return "no " + type + " rows for the plain " + std::to_string(bits) + "-bit all-reduce on " +
             std::to_string(ranks) + " ranks";
    return "no " + type + " rows at " + std::to_string(bits) + " bits on " + std::to_string(ranks) +
           " ranks";
  }

  std::string file_, regime_;
  std::map<key, std::map<double, std::vector<double>>> raw_;
  std::map<key, calibration_series> series_;
  std::unique_ptr<counts> counts_;
};

namespace detail {

/// A CSV line's fields (lowbit-perf writes no quotes), a trailing '\r' dropped.
inline std::vector<std::string> csv_fields(std::string line) {
  if (!line.empty() && line.back() == '\r') line.pop_back();
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = line.find(',', start);
    out.push_back(line.substr(start, comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

/// A field as a finite number, or an invalid_argument naming `where` and the column.
inline double csv_number(const std::string& text, const std::string& column,
                         const std::string& where) {
  errno = 0;
  char* end = nullptr;
  const double v = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
  LOWBIT_EXPECTS(
      !text.empty() && end == text.c_str() + text.size() && errno == 0 && std::isfinite(v),
      where + ": column '" + column + "' is not a number: '" + text + "'");
  return v;
}

}  // namespace detail

/// Reads lowbit-perf's CSV rows (bench/lowbit_perf, --csv FILE; a header line before every
/// run's rows) into a calibration: the all_reduce rows of `filter`'s regime and feedback.
/// With no regime named, the file's all_reduce rows must hold exactly one. Throws
/// invalid_argument naming file:line for a missing column, a row of the wrong width, a
/// field that is not a number, a non-positive size or time, or a width or ranks out of
/// range; and naming the file when no row matches (listing the regimes there are).
inline comm_calibration load_comm_calibration(const std::string& path,
                                              const calibration_filter& filter = {}) {
  std::ifstream in(path);
  LOWBIT_EXPECTS(in.good(), "cannot read calibration table '" + path + "'");
  static const char* const needed[] = {"regime", "coll",  "type",      "bits",   "feedback",
                                       "ranks",  "bytes", "lowbit_us", "nccl_us"};
  struct row {
    std::string regime, type;
    int bits, ranks;
    double bytes, lowbit_us, nccl_us;
  };
  std::vector<row> rows;
  std::map<std::string, std::size_t> col;  // of the last header line
  std::size_t width = 0, line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    const std::string where = path + ":" + std::to_string(line_no);
    if (line.empty() || line == "\r") continue;
    const std::vector<std::string> f = detail::csv_fields(line);
    if (f.front() == "regime") {  // lowbit-perf writes a header at every run
      col.clear();
      for (std::size_t i = 0; i < f.size(); ++i) col[f[i]] = i;
      std::string missing;
      for (const char* c : needed)
        if (col.count(c) == 0) missing += (missing.empty() ? "" : ", ") + std::string(c);
      LOWBIT_EXPECTS(missing.empty(), where + ": header lacks column(s) " + missing);
      width = f.size();
      continue;
    }
    LOWBIT_EXPECTS(width > 0, where + ": a row before the header line (regime,coll,...)");
    LOWBIT_EXPECTS(f.size() == width, where + ": " + std::to_string(f.size()) +
                                          " fields, the header has " + std::to_string(width));
    const auto get = [&](const char* c) -> const std::string& { return f[col.at(c)]; };
    const auto num = [&](const char* c) { return detail::csv_number(get(c), c, where); };
    row r{get("regime"), get("type"), 0, 0, num("bytes"), num("lowbit_us"), num("nccl_us")};
    const double bits = num("bits"), ranks = num("ranks");
    LOWBIT_EXPECTS(bits == std::floor(bits) && bits >= 1 && bits <= 8,
                   where + ": bits must be 1..8, got " + get("bits"));
    LOWBIT_EXPECTS(ranks == std::floor(ranks) && ranks >= 1,
                   where + ": ranks must be a whole number >= 1, got " + get("ranks"));
    LOWBIT_EXPECTS(r.bytes > 0 && r.lowbit_us > 0 && r.nccl_us > 0,
                   where + ": bytes, lowbit_us and nccl_us must be positive");
    r.bits = static_cast<int>(bits);
    r.ranks = static_cast<int>(ranks);
    if (get("coll") != "all_reduce" || get("feedback") != filter.feedback) continue;
    LOWBIT_EXPECTS(element_bytes(r.type) > 0,
                   where + ": unknown type '" + r.type + "' (float, bfloat16 or half)");
    rows.push_back(std::move(r));
  }
  LOWBIT_EXPECTS(width > 0, path + ": no header line (regime,coll,type,...)");
  std::set<std::string> regimes;
  for (const row& r : rows) regimes.insert(r.regime);
  std::string listed;
  for (const auto& g : regimes) listed += (listed.empty() ? "" : ", ") + g;
  LOWBIT_EXPECTS(!regimes.empty(), path + ": no all_reduce rows with feedback " + filter.feedback);
  LOWBIT_EXPECTS(!filter.regime.empty() || regimes.size() == 1,
                 path + ": rows of several regimes (" + listed + "); name one (FILE:REGIME)");
  const std::string regime = filter.regime.empty() ? *regimes.begin() : filter.regime;
  LOWBIT_EXPECTS(regimes.count(regime) == 1, path + ": no all_reduce rows of regime '" + regime +
                                                 "' (there are " + listed + ")");
  comm_calibration c(path, regime);
  for (const row& r : rows) {
    if (r.regime != regime) continue;
    c.add(r.ranks, r.bits, r.type, r.bytes, r.lowbit_us);
    c.add(r.ranks, r.type == "float" ? 32 : 16, r.type, r.bytes, r.nccl_us);
  }
  c.finish();
  return c;
}

}  // namespace lowbit::qsync
