"""Where a mixed plan's time goes, predicted against traced, op by op.

    python3 -m qsync.plan_gap OUT CASE PLAN --lowbit-plan BIN [--top N]

OUT is a validate.py run with ``--trace-plans`` (its ``traces/<CASE>_plan_<PLAN>.json.gz``:
the step under the applied plan, profiled with a range per op). lowbit-plan replays the
plan twice with ``--timeline``: as predicted (the uniform profiles, the switch costs) and
from the plan's own trace (that trace as the only profile, the plan as uniform fp32, so
that every op's kernels are the ones the plan ran). The two timelines are summed per op
and kind (forward, backward; the predicted edge casts on their own rows): the table lists
the ops whose GPU or host time differs most, then the totals. Both sides' host times come
from instrumented ranges (the profiler's overhead is in both); GPU times are the kernels'.
"""

import argparse
import csv
import os
import sys
import tempfile
from typing import Dict, Tuple

from . import qsync_model as qm
from .validate import lowbit_plan, plan_args, reads_gz


def timeline_by_op(path: str) -> Dict[Tuple[str, str], Tuple[float, float]]:
    """(op, kind) -> (host ms, GPU ms) summed over the timeline CSV's kernels; the tail
    (optimizer step, code after the last op) as ("tail", "")."""
    out: Dict[Tuple[str, str], Tuple[float, float]] = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            key = ("tail", "") if r["kind"] == "tail" else (r["op"] or "(no op)", r["kind"])
            h, g = out.get(key, (0.0, 0.0))
            out[key] = (h + float(r["cpu_ms"]), g + float(r["gpu_ms"]))
    return out


def gap(out_dir: str, case: str, plan: str, binary: str):
    """(rows, totals): per (op, kind) the predicted and traced host and GPU ms."""
    trace = os.path.join(out_dir, "traces", "%s_plan_%s.json.gz" % (case, plan))
    plan_file = os.path.join(out_dir, "plans", "%s_%s.json" % (case, plan))
    for p in (trace, plan_file):
        if not os.path.exists(p):
            raise FileNotFoundError("%s: not there (validate.py --trace-plans writes the "
                                    "plan traces)" % p)
    with tempfile.TemporaryDirectory() as tmp:
        gz = reads_gz(binary, out_dir, case)
        predicted = os.path.join(tmp, "predicted.csv")
        base = plan_args(out_dir, case, tmp, gz=gz)  # --model M --cluster C --traces ...
        lowbit_plan(binary, base + ["--plan", plan_file, "--timeline", predicted])
        traced = os.path.join(tmp, "traced.csv")
        model, cluster = base[1], base[3]
        uniform = qm.write_json(os.path.join(tmp, "fp32.json"), qm.uniform_plan("fp32"))
        lowbit_plan(binary, ["--model", model, "--cluster", cluster, "--traces",
                             "fp32=" + (trace if gz else qm.gunzip_to(trace, tmp)),
                             "--plan", uniform, "--timeline", traced])
        a, b = timeline_by_op(predicted), timeline_by_op(traced)
    rows = []
    for key in list(a) + [k for k in b if k not in a]:
        (ph, pg), (th, tg) = a.get(key, (0.0, 0.0)), b.get(key, (0.0, 0.0))
        rows.append(dict(op=key[0], kind=key[1], predicted_host=ph, traced_host=th,
                         predicted_gpu=pg, traced_gpu=tg))
    totals = {k: sum(r[k] for r in rows) for k in
              ("predicted_host", "traced_host", "predicted_gpu", "traced_gpu")}
    return rows, totals


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="validate.py's OUT (run with --trace-plans)")
    ap.add_argument("case", help="the case, e.g. tv-resnet50-b128")
    ap.add_argument("plan", help="the plan's name, e.g. alloc-5pct")
    ap.add_argument("--lowbit-plan", required=True, help="the lowbit-plan binary")
    ap.add_argument("--top", type=int, default=15, help="rows to list (default 15)")
    ap.add_argument("--csv", help="also write every row as CSV")
    a = ap.parse_args(argv)
    try:
        rows, totals = gap(a.out, a.case, a.plan, a.lowbit_plan)
    except (FileNotFoundError, RuntimeError) as e:
        print("plan_gap: %s" % e, file=sys.stderr)
        return 2
    if a.csv:
        qm.write_csv(a.csv, list(rows[0]), rows)
    rows.sort(key=lambda r: -max(abs(r["traced_gpu"] - r["predicted_gpu"]),
                                 abs(r["traced_host"] - r["predicted_host"])))
    print("%s %s: predicted against traced (ms), the %d largest differences" % (
        a.case, a.plan, min(a.top, len(rows))))
    print("| op | kind | host predicted | host traced | GPU predicted | GPU traced |")
    print("|---|---|---|---|---|---|")
    for r in rows[:a.top]:
        print("| %s | %s | %.3f | %.3f | %.3f | %.3f |" % (
            r["op"], r["kind"], r["predicted_host"], r["traced_host"], r["predicted_gpu"],
            r["traced_gpu"]))
    print("| total | | %.3f | %.3f | %.3f | %.3f |" % (
        totals["predicted_host"], totals["traced_host"], totals["predicted_gpu"],
        totals["traced_gpu"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
