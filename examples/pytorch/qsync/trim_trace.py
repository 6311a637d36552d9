"""Cuts a PyTorch-profiler Chrome trace down to one profiler step (for test data):

    lowbit-qsync-trim-trace IN.json[.gz] OUT.json[.gz] [--step K]

Keeps the step's ``ProfilerStep#N`` range (the K-th in start order, 0-based, default the
middle one), every host event (ranges, ops, runtime calls, any thread) that starts
inside it, the GPU events (kernels, copies, sets) whose ``args.correlation`` is one of
the kept runtime calls' (a kernel may run after the step's host range ends), the GPU
annotations that start between the first and last kept GPU event, and the metadata
events; flow arrows are dropped (the trace loader matches by correlation). Events are
written as they were, so the result is a real trace of one iteration."""

import argparse
import gzip
import json
import sys

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def trim(trace: dict, step: int = -1) -> dict:
    """`trace` reduced to one profiler step (see the module docstring)."""
    ev = trace["traceEvents"]
    steps = sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                    and e.get("name", "").startswith("ProfilerStep#")), key=lambda e: e["ts"])
    if not steps:
        raise ValueError("the trace has no ProfilerStep ranges")
    s = steps[len(steps) // 2 if step < 0 else step]
    lo, hi = s["ts"], s["ts"] + s["dur"]
    gpu_side = GPU_CATS | {"gpu_user_annotation"}
    host = [e for e in ev if e.get("ph") == "X" and e.get("cat") not in gpu_side
            and lo <= e["ts"] <= hi]
    runtime = ("cuda_runtime", "cuda_driver")
    corr = {e["args"]["correlation"] for e in host
            if e.get("cat") in runtime and "correlation" in e.get("args", {})}
    gpu = [e for e in ev if e.get("ph") == "X" and e.get("cat") in GPU_CATS
           and e.get("args", {}).get("correlation") in corr]
    keep = [e for e in ev if e.get("ph") == "M"] + host + gpu
    if gpu:
        g0, g1 = min(e["ts"] for e in gpu), max(e["ts"] + e["dur"] for e in gpu)
        keep += [e for e in ev if e.get("ph") == "X" and e.get("cat") == "gpu_user_annotation"
                 and g0 <= e["ts"] <= g1]
    out = {k: v for k, v in trace.items() if k != "traceEvents"}
    out["traceEvents"] = keep
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--step", type=int, default=-1, help="0-based step (default: the middle)")
    a = ap.parse_args(argv)
    opener = gzip.open if a.src.endswith(".gz") else open
    with opener(a.src, "rt") as f:
        t = trim(json.load(f), a.step)
    if a.dst.endswith(".gz"):
        with gzip.open(a.dst, "wt", compresslevel=9) as f:
            json.dump(t, f, separators=(",", ":"))
    else:
        with open(a.dst, "w") as f:
            json.dump(t, f, separators=(",", ":"))
    print("%s: %d events" % (a.dst, len(t["traceEvents"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
