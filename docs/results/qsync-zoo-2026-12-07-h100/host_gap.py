"""The host a plan's wrapped ops cost beyond what lowbit-plan priced for them, per plan of
this run. Needs the two calls' returned archives unpacked (`cat zoo.tgz.part-* | tar xz`;
their traces are not committed, about 35 MB a call) and lowbit-plan:

    python3 docs/results/qsync-zoo-2026-12-07-h100/host_gap.py LOWBIT_PLAN DIR1 DIR2

DIRk: part k's unpacked gpu-qsync-zoo folder. Each plan is re-predicted with its part's
recorded command (predict_commands.txt) and --timeline; the replay's host end (the tail
row's issue time) is the predicted host, `host_ms_median` of measured.csv the measured.
A case's residual is measured less predicted host, less the mean of its uniform fp16 and
bf16 plans' (the host's drift in that case against its profiles), over the plans that
wrap ops."""
import csv
import os
import re
import statistics as st
import subprocess
import sys
import tempfile

plan_bin, dirs = sys.argv[1], sys.argv[2:]
tmp = tempfile.mkdtemp()
cases = {}
for d in dirs:
    cmds = {re.search(r"/predicted/(\S+)\.json", c).group(1): c
            for c in open(os.path.join(d, "predict_commands.txt")).read().splitlines() if c}
    for r in csv.DictReader(open(os.path.join(d, "measured.csv"))):
        key = r["case"].replace("/", "_")
        cmd = cmds[key].replace("/tmp/gpu-qsync-zoo", d).split()[1:]
        tl = os.path.join(tmp, key + ".csv")
        cmd = [plan_bin] + cmd[:cmd.index("--json")] + ["--timeline", tl]
        subprocess.run(cmd, check=True, capture_output=True)
        tail = [t for t in csv.DictReader(open(tl)) if t["kind"] == "tail"][0]
        wrapped = int(re.search(r"(\d+) wrapped", r["plan_summary"]).group(1))
        cases.setdefault(r["model"], {})[r["plan"]] = (
            wrapped, float(tail["issued_ms"]), float(r["host_ms_median"]))
print("case,plan,wrapped,predicted_host_ms,measured_host_ms,residual_ms,residual_per_wrapped_ms")
per = []
for case, plans in sorted(cases.items()):
    drift = st.mean(plans[p][2] - plans[p][1] for p in ("fp16", "bf16"))
    for plan, (w, pred, meas) in sorted(plans.items()):
        if w == 0:
            continue
        res = meas - pred - drift
        per.append(res / w)
        print("%s,%s,%d,%.2f,%.2f,%+.2f,%+.4f" % (case, plan, w, pred, meas, res, res / w))
print("# %d plans that wrap ops: residual a wrapped op, median %+.4f ms" % (len(per), st.median(per)),
      file=sys.stderr)
