"""Two readings of this run, from the files beside this script. Run from the repository
root: python3 docs/results/qsync-zoo-2026-12-06-h100/analysis.py

1. Host noise: one uniform step's host side timed twice in the same rounds
   (host_times.json): the precision's host samples, which lowbit-plan is given, against
   the host times of the same step while its uniform plan was timed; host-bound pairs
   only (host at least 90% of the step).
2. What a plan's wrapped ops cost the host: each mixed or allocator plan's host time
   (the run log's "host" of the plan) less that of the uniform plan of its ambient
   precision, per case, beside the same figure from the run before the applier's fix
   (docs/results/qsync-zoo-2026-12-06/, parts 1 and 2: that run's other logs did not
   come back).
3. Whether more host samples would help: for the same host-bound pairs, the difference
   expected if samples and timed host times were independent draws from one spread
   (resampled from the two pooled, 200 draws a pair, seed 1), against the one observed."""
import collections
import importlib.util
import random
import re
import statistics as st

HOST_PAIRS = "docs/results/qsync-zoo-2026-12-06/host_pairs.py"

LINE = re.compile(r"\] (\S+)/(\S+): median ([\d.]+) ms .*host ([\d.]+) ms.*"
                  r"\(ambient (\w+); .*; (\d+) wrapped\)")


def plan_hosts(paths):
    """{(case, plan): (host ms, ambient precision, wrapped ops)} from run logs."""
    out = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                m = LINE.search(line)
                if m:
                    out[(m[1], m[2])] = (float(m[4]), m[5], int(m[6]))
    return out


def extra_host(logs):
    """{case: {plan: (wrapped, extra host ms)}} for plans that wrap ops."""
    out = collections.defaultdict(dict)
    for (case, plan), (host, ambient, wrapped) in logs.items():
        base = logs.get((case, ambient))
        if wrapped and plan != ambient and base:
            out[case][plan] = (wrapped, host - base[0])
    return out


def readings(D, PARTS, before_logs):
    """Readings 1 to 3 of the run whose part logs and host samples are D/<part>-*, the
    wrapped ops' host set against the run logs `before_logs`."""
    host_pairs = importlib.util.spec_from_file_location("host_pairs", HOST_PAIRS)
    hp = importlib.util.module_from_spec(host_pairs)
    host_pairs.loader.exec_module(hp)
    pools = [(samples, host) for _, _, samples, host in hp.host_bound_pairs(D, PARTS)]
    diffs = [100.0 * (st.median(samples) / st.median(host) - 1.0) for samples, host in pools]
    print("1. %d host-bound uniform pairs: samples against the step's host while timed: "
          "median |difference| %.1f%%, over 15%% in %d, from %+.0f%% to %+.0f%%"
          % (len(diffs), st.median(abs(d) for d in diffs), sum(abs(d) > 15 for d in diffs),
             min(diffs), max(diffs)))

    now = extra_host(plan_hosts(D + p + "-run.log" for p in PARTS))
    before = extra_host(plan_hosts(before_logs))
    per_op = lambda d: st.median(x / n for v in d.values() for n, x in v.values())
    print("2. extra host a wrapped op, median over plans: %.3f ms now (%d plans), %.3f ms before "
          "(%d plans)" % (per_op(now), sum(map(len, now.values())), per_op(before),
                          sum(map(len, before.values()))))
    plans = ("mixed-ends", "mixed-norms", "alloc-5pct", "alloc-15pct")
    print("   extra host ms per plan, before / now (- where not measured):")
    print("   %-24s %s" % ("case", "  ".join("%-13s" % p for p in plans)))
    for case in sorted(set(now) | set(before)):
        cell = lambda d, p: "%+.1f" % d[case][p][1] if p in d.get(case, {}) else "-"
        pair = lambda p: "%s / %s" % (cell(before, p), cell(now, p))
        print("   %-24s %s" % (case, "  ".join("%-13s" % pair(p) for p in plans)))

    random.seed(1)
    print("3. the same pairs if samples and timed host times were one spread (resampled):")
    for n in (15, 30, 60):
        expected = []
        for samples, timed in pools:
            pool = samples + timed
            expected.append(st.median(
                abs(st.median(random.choices(pool, k=n)) /
                    st.median(random.choices(pool, k=len(timed))) - 1.0) * 100.0
                for _ in range(200)))
        print("   %d samples against the pair's timed steps: median |difference| %.1f%%, over 15%% "
              "in %d" % (n, st.median(expected), sum(e > 15 for e in expected)))


if __name__ == "__main__":
    readings("docs/results/qsync-zoo-2026-12-06-h100/", ("part1", "part2", "rerun"),
             ["docs/results/qsync-zoo-2026-12-06/part1-h200-run.log",
              "docs/results/qsync-zoo-2026-12-06/part2-h100-run.log"])
