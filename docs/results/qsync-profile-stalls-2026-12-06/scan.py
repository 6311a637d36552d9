"""The host time of each profiled step of every profile of a zoo run (ProfilerStep less
the device synchronisations in it), and the profiles whose steps differ by more than 25%;
then, for one profile, the op ranges whose host time differs most between its steps.

    python3 scan.py TRACES_DIR [CASE_PRECISION]

TRACES_DIR: a zoo call's `traces/` (the returned archive unpacked; not committed).
"""
import collections
import gzip
import json
import os
import re
import sys


def events(path):
    return [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X"]


def step_hosts(ev):
    steps = sorted((e for e in ev if e.get("cat") == "user_annotation"
                    and e["name"].startswith("ProfilerStep")), key=lambda e: e["ts"])
    syncs = [e for e in ev if e["name"] == "cudaDeviceSynchronize"]
    return steps, [(s["dur"] - sum(y["dur"] for y in syncs
                                   if s["ts"] <= y["ts"] <= s["ts"] + s["dur"])) / 1e3
                   for s in steps]


def gaps(ev, steps):
    """Per op range, its host span in each step: from the end of the range before it on
    its thread to its own end (the trace loader's definition, without the waits)."""
    ranges = sorted((e for e in ev if e.get("cat") == "user_annotation"
                     and not e["name"].startswith("ProfilerStep")), key=lambda e: e["ts"])
    out = collections.defaultdict(dict)
    for i, s in enumerate(steps):
        last = {}
        for r in ranges:
            if not s["ts"] <= r["ts"] <= s["ts"] + s["dur"]:
                continue
            start = last.get(r["tid"], s["ts"] if r["tid"] == s["tid"] else r["ts"])
            out[r["name"]][i] = out[r["name"]].get(i, 0.0) + (r["ts"] + r["dur"] - start) / 1e3
            last[r["tid"]] = r["ts"] + r["dur"]
    return out


def main(tdir, one=None):
    n = flagged = 0
    for f in sorted(os.listdir(tdir)):
        if not re.match(r".*_(fp32|fp16|bf16)\.json\.gz$", f):
            continue
        n += 1
        _, h = step_hosts(events(os.path.join(tdir, f)))
        if len(h) >= 2 and max(h) > 1.25 * min(h):
            flagged += 1
            print("%-40s steps' host ms: %s" % (f, " ".join("%.1f" % x for x in h)))
    print("%d of %d profiles with steps more than 25%% apart" % (flagged, n))
    if one:
        ev = events(os.path.join(tdir, one + ".json.gz"))
        steps = [s for s in step_hosts(ev)[0] if s["tid"] != 0]
        per = gaps(ev, steps)
        spread = sorted(((max(v.values()) - min(v.values()), k, v) for k, v in per.items()
                         if len(v) == len(steps)), reverse=True)[:5]
        for d, k, v in spread:
            print("%-45s %s" % (k, " ".join("%.2f" % v[i] for i in sorted(v))))


if __name__ == "__main__":
    main(*sys.argv[1:])
