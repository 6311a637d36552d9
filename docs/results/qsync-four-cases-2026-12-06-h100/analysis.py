"""The forward and backward host a plan that wraps ops adds over the uniform plan of its
ambient precision (the medians of the timed steps' phases), per wrapped op:

    python3 analysis.py run3-measured.csv run3-host_times.json
"""
import csv
import json
import statistics as st
import sys

rows = list(csv.DictReader(open(sys.argv[1])))
ht = json.load(open(sys.argv[2]))
for r in rows:
    summary = r["plan_summary"]
    ambient = summary.split(";")[0].split()[-1]
    wrapped = int(summary.split(";")[-1].split()[0])
    if wrapped == 0:
        continue
    plans = ht[r["model"]]["plans"]

    def phase(pn, k):
        return st.median([x[k] for rr in plans[pn]["phases"] for x in rr])

    fwd = phase(r["plan"], 0) - phase(ambient, 0)
    bwd = phase(r["plan"], 1) - phase(ambient, 1)
    print("%-28s wrapped %3d  forward %+5.1f ms (%.3f a wrapped op)  backward %+5.1f ms" % (
        r["case"], wrapped, fwd, fwd / wrapped, bwd))
