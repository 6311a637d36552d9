"""How much a training step's host time drifts on this machine, and why.

    lowbit-qsync-host-drift --out OUT [--cases bert-b32,cnn-b1] [--rounds 6] [--steps 10]

For each case of validate.py it builds the model and a uniform-precision step per
precision (the same ``training_step`` validate.py times), then runs ``--rounds`` rounds;
each round runs, for every condition and precision in turn (ABAB), a block of 2
settling and ``--steps`` timed steps. Per step it records the host time (up to the
final synchronize, as validate.py), the whole step, the process's CPU time (every
thread) and the main thread's CPU time; per block the machine's /proc/stat deltas
(steal, idle), the process's thread count and the CPU the main thread ended on; per
round a host-speed probe (2000 launches of a tiny kernel, no model). Conditions:

- ``default``: as validate.py ran before (gc on, threads unpinned);
- ``nogc``: ``gc.collect(); gc.freeze(); gc.disable()`` around the block;
- ``pin``: every thread of the process pinned to the CPUs local to the GPU (or all);
- ``pin1``: the main thread and autograd's device thread each pinned to a core of its
  own, other threads to the rest;
- ``nogc+pin``;
- ``threads1``: ``torch.set_num_threads(1)`` (no intra-op CPU pool).

Halfway through (after round ``rounds // 2``) it profiles each precision's step the way
validate.py does (ranges and the stock torch.profiler), so rounds before and after
show what a profiler session leaves behind. Writes OUT/host_drift.json (every step)
and prints a summary: per case, precision and condition the median host ms of each
round, the spread, and the CPU-time ratio.
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import sys
import tempfile
import time

CONDITIONS = ("default", "nogc", "pin", "pin1", "nogc+pin", "threads1")


def proc_stat():
    """Aggregate CPU jiffies: user, nice, system, idle, iowait, irq, softirq, steal."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return dict(zip(("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"), v))


def threads():
    """{tid: name} of this process's threads."""
    out = {}
    for d in glob.glob("/proc/self/task/*"):
        try:
            with open(os.path.join(d, "comm")) as f:
                out[int(os.path.basename(d))] = f.read().strip()
        except OSError:
            pass
    return out


def last_cpu():
    """The CPU the calling thread last ran on (/proc/thread-self/stat field 39)."""
    try:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return -1


def gpu_local_cpus():
    """CPUs local to the NVIDIA GPU's PCI device (every CPU where unknown)."""
    cpus = set()
    for d in glob.glob("/sys/bus/pci/drivers/nvidia/*/local_cpulist"):
        with open(d) as f:
            for part in f.read().strip().split(","):
                if "-" in part:
                    a, b = part.split("-")
                    cpus.update(range(int(a), int(b) + 1))
                elif part:
                    cpus.add(int(part))
    return sorted(cpus & os.sched_getaffinity(0)) or sorted(os.sched_getaffinity(0))


def set_affinity(mode, allcpus, local):
    """Pins the process's threads: 'none' (all CPUs), 'pin' (the GPU's local CPUs),
    'pin1' (main thread and autograd's threads each on a core of its own)."""
    main = __import__("threading").get_native_id()
    tids = threads()
    for tid, name in tids.items():
        try:
            if mode == "none":
                os.sched_setaffinity(tid, allcpus)
            elif mode == "pin":
                os.sched_setaffinity(tid, local)
            else:
                if tid == main:
                    os.sched_setaffinity(tid, {local[0]})
                elif "autograd" in name:
                    os.sched_setaffinity(tid, {local[1 % len(local)]})
                else:
                    os.sched_setaffinity(tid, set(local[2:]) or set(local))
        except OSError:
            pass


def probe(torch, n=2000):
    """Host speed without a model: ms for n launches of a tiny add, then a sync."""
    x = torch.zeros(16, device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        x.add_(1.0)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return 1000.0 * (t1 - t)


def block(torch, step_fn, steps):
    """2 settling steps, then `steps` timed ones; per step host, whole, cpu, main-cpu."""
    for _ in range(2):
        step_fn(None)
    rows = []
    st0 = proc_stat()
    for _ in range(steps):
        host = []
        c0, m0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
        step_fn(host)
        rows.append({"host_ms": host[0], "step_ms": 1000.0 * (time.perf_counter() - w0),
                     "cpu_ms": 1000.0 * (time.process_time() - c0),
                     "main_cpu_ms": 1000.0 * (time.thread_time() - m0)})
    st1 = proc_stat()
    d = {k: st1[k] - st0[k] for k in st0}
    tot = sum(d.values()) or 1
    return rows, {"steal_pct": 100.0 * d["steal"] / tot, "idle_pct": 100.0 * d["idle"] / tot,
                  "threads": len(threads()), "cpu": last_cpu(), "gc_counts": gc.get_count()}


def median(xs):
    s = sorted(xs)
    n = len(s)
    return 0.5 * (s[(n - 1) // 2] + s[n // 2]) if n else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="bert-b32,cnn-b1")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    import torch

    from . import export as ex
    from . import validate as va

    os.makedirs(args.out, exist_ok=True)
    torch.backends.cudnn.benchmark = False
    allcpus = sorted(os.sched_getaffinity(0))
    local = gpu_local_cpus()
    env = {"cpus": allcpus, "gpu_local_cpus": local, "torch_threads": torch.get_num_threads(),
           "loadavg": open("/proc/loadavg").read().strip()}
    try:
        with open("/proc/cpuinfo") as f:
            env["cpu_model"] = next(line.split(":", 1)[1].strip() for line in f
                                    if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(json.dumps(env), flush=True)
    result = {"env": env, "cases": {}}
    for name in args.cases.split(","):
        spec = va.CASES[name]
        model, forward_loss = va.make_case(torch, name, spec, "cuda")
        precisions = spec.get("precisions", va.PRECISIONS)
        # fp32 BERT is GPU-bound (5x the 16-bit step): its host time is not the question
        precisions = [p for p in precisions if p != "fp32"] + (
            [] if spec["model"] == "bert" else ["fp32"])
        opts = {p: va.new_optimizer(torch, model) for p in precisions}
        steps = {p: va.training_step(torch, model, opts[p], forward_loss,
                                     lambda p=p: ex.precision_context(p, "cuda"))
                 for p in precisions}
        for p in precisions:
            for _ in range(3):
                steps[p]()
        blocks = []
        for r in range(args.rounds):
            if r == args.rounds // 2:  # a profiler session, as validate.py runs one
                for p in precisions:
                    with tempfile.TemporaryDirectory() as tmp:
                        with ex.instrument(model):
                            ex.profile(steps[p], os.path.join(tmp, "t.json"), steps=3)
                        ex.profile(steps[p], os.path.join(tmp, "t.json"), steps=3)
                blocks.append({"round": r, "event": "profiled", "threads": len(threads())})
            blocks.append({"round": r, "probe_ms": probe(torch)})
            for cond in CONDITIONS:
                for p in precisions:
                    set_affinity("pin1" if cond == "pin1" else
                                 "pin" if "pin" in cond else "none", allcpus, local)
                    if "nogc" in cond:
                        gc.collect()
                        gc.freeze()
                        gc.disable()
                    nthreads = torch.get_num_threads()
                    if cond == "threads1":
                        torch.set_num_threads(1)
                    try:
                        rows, info = block(torch, steps[p], args.steps)
                    finally:
                        torch.set_num_threads(nthreads)
                        gc.enable()
                        gc.unfreeze()
                        set_affinity("none", allcpus, local)
                    info.update({"round": r, "cond": cond, "precision": p, "steps": rows})
                    blocks.append(info)
        result["cases"][name] = blocks
        # summary
        print("== %s" % name, flush=True)
        print("probe ms per round: %s" % " ".join(
            "%.1f" % b["probe_ms"] for b in blocks if "probe_ms" in b))
        for p in precisions:
            for cond in CONDITIONS:
                bs = [b for b in blocks if b.get("cond") == cond and b.get("precision") == p]
                meds = [median([s["host_ms"] for s in b["steps"]]) for b in bs]
                stepm = [median([s["step_ms"] for s in b["steps"]]) for b in bs]
                cpu = [median([s["cpu_ms"] / s["host_ms"] for s in b["steps"]]) for b in bs]
                allh = [s["host_ms"] for b in bs for s in b["steps"]]
                print("%-5s %-9s host/round %s | step/round %s | all %.1f [%.1f-%.1f] "
                      "cpu/host %.2f steal %.1f%% cpu#%s" % (
                          p, cond, " ".join("%.1f" % m for m in meds),
                          " ".join("%.1f" % m for m in stepm), median(allh), min(allh),
                          max(allh), median(cpu), median([b["steal_pct"] for b in bs]),
                          ",".join(str(b["cpu"]) for b in bs)), flush=True)
        del model, opts, steps
        gc.collect()
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, "host_drift.json"), "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
