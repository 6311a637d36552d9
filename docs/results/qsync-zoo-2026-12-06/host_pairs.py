"""The host side of one uniform step timed twice in the same rounds (validate.py's
host_times.json): the precision's host samples, which lowbit-plan is given, against the
host times of the same step while its uniform plan was timed. Host-bound pairs only (host
at least 90% of the step). Run from the repository root."""
import json
import statistics as st

D = "docs/results/qsync-zoo-2026-12-06/"


def host_bound_pairs(directory, parts):
    """(case, precision, samples, timed host times) of every host-bound uniform step in
    `directory`'s <part>-host_times.json files."""
    out = []
    for part in parts:
        with open(directory + part + "-host_times.json") as f:
            cases = json.load(f)
        for case, h in cases.items():
            for p in ("fp32", "fp16", "bf16"):
                samples = [x for r in h["precisions"][p]["rounds"] for x in r]
                host = [x for r in h["plans"][p]["host"] for x in r]
                step = st.median([x for r in h["plans"][p]["times"] for x in r])
                if st.median(host) >= 0.9 * step:
                    out.append((case, p, samples, host))
    return out


if __name__ == "__main__":
    diffs = []
    for case, p, samples, host in host_bound_pairs(D, ("part1", "part2")):
        s, h = st.median(samples), st.median(host)
        diffs.append(100.0 * (s / h - 1.0))
        print("%-22s %s samples %.1f ms, while timed %.1f ms: %+.0f%%" % (case, p, s, h,
                                                                         diffs[-1]))
    print("%d host-bound pairs: median |difference| %.1f%%, over 15%% in %d, from %+.0f%% to "
          "%+.0f%%" % (len(diffs), st.median(abs(d) for d in diffs),
                       sum(abs(d) > 15 for d in diffs), min(diffs), max(diffs)))
