"""Predicted against measured host time of every plan of this run: lowbit-plan's
--timeline (when the replay's host has issued the step, tail included) for each plan,
beside the plan's host time in the run logs. Needs the two calls' returned archives
unpacked (their traces are not committed: about 22 MB a call), each re-predicted
(validate.py --predict, the run log's command), and lowbit-plan:

    python3 docs/results/qsync-zoo-2026-12-06b-h100/host_predicted.py LOWBIT_PLAN \\
        part1=DIR part2=DIR > host_predicted.csv
    python3 docs/results/qsync-zoo-2026-12-06b-h100/host_predicted.py --summary host_predicted.csv
"""
import csv
import os
import re
import shlex
import statistics as st
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LINE = re.compile(r"\] (\S+)/(\S+): median ([\d.]+) ms .*host ([\d.]+) ms.*"
                  r"\(ambient (\w+); .*; (\d+) wrapped\)")
FIELDS = ["case", "plan", "ambient", "wrapped", "step_ms", "host_ms", "predicted_ms",
          "predicted_host_ms"]


def measured(log):
    with open(log) as f:
        return {(m[1], m[2]): (float(m[3]), float(m[4]), m[5], int(m[6]))
                for m in map(LINE.search, f) if m}


def predict(plan_bin, out, case, plan):
    """(predicted step, predicted host end) of one plan from OUT's predict_commands.txt."""
    with open(os.path.join(out, "predict_commands.txt")) as f:
        line = next(l for l in f if "/plans/%s_%s.json" % (case, plan) in l)
    args = shlex.split(line)[1:]
    if "--json" in args:
        i = args.index("--json")
        del args[i:i + 2]
    with tempfile.NamedTemporaryFile(suffix=".csv") as tl:
        subprocess.run([plan_bin] + args + ["--timeline", tl.name], check=True,
                       capture_output=True)
        rows = list(csv.DictReader(open(tl.name)))
    return (max(float(r["end_ms"]) for r in rows), max(float(r["issued_ms"]) for r in rows))


def table(plan_bin, parts):
    w = csv.DictWriter(sys.stdout, fieldnames=FIELDS)
    w.writeheader()
    for part, out in parts:
        for (case, plan), (step, host, ambient, wrapped) in measured(
                os.path.join(HERE, part + "-run.log")).items():
            end, host_end = predict(plan_bin, out, case, plan)
            w.writerow(dict(case=case, plan=plan, ambient=ambient, wrapped=wrapped,
                            step_ms=step, host_ms=host, predicted_ms="%.3f" % end,
                            predicted_host_ms="%.3f" % host_end))


def summary(path):
    rows = list(csv.DictReader(open(path)))
    for r in rows:
        for k in FIELDS[3:]:
            r[k] = float(r[k])
    by = {(r["case"], r["plan"]): r for r in rows}
    err = lambda r: 100.0 * (r["predicted_host_ms"] / r["host_ms"] - 1.0)
    uniform = [err(r) for r in rows if not r["wrapped"]]
    wrapped = [r for r in rows if r["wrapped"]]
    print("host predicted against measured, median: plans that wrap nothing %+.1f%% (%d), that "
          "wrap ops %+.1f%% (%d)" % (st.median(uniform), len(uniform),
                                     st.median(map(err, wrapped)), len(wrapped)))
    extra = [((r["host_ms"] - by[(r["case"], r["ambient"])]["host_ms"]) / r["wrapped"],
              (r["predicted_host_ms"] - by[(r["case"], r["ambient"])]["predicted_host_ms"]) /
              r["wrapped"]) for r in wrapped]
    print("host a plan adds over its ambient uniform plan, a wrapped op, median: measured "
          "%.3f ms, predicted %.3f ms" % (st.median(e[0] for e in extra),
                                          st.median(e[1] for e in extra)))
    gpu = [r for r in wrapped if r["host_ms"] < 0.9 * r["step_ms"]]
    print("plans that wrap ops on GPU-bound steps (%d): host %+.1f%%, step %+.1f%% (medians)"
          % (len(gpu), st.median(map(err, gpu)),
             st.median(100.0 * (r["predicted_ms"] / r["step_ms"] - 1.0) for r in gpu)))


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        summary(sys.argv[2])
    else:
        table(sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]])
