"""Re-predicts the zoo's peak memory from model JSONs exported on the CPU, with two lowbit-plan binaries, beside the run's measured peak."""
import csv, json, subprocess, sys, os
old_bin, new_bin, out_csv = sys.argv[1], sys.argv[2], sys.argv[3]
cases = [a.split(":") for a in sys.argv[4:]]  # model:batch
rows = {(r['model'], r['batch'], r['plan']): r for r in csv.DictReader(open('docs/results/qsync-memory-2026-12-05/zoo-h200-2026-12-03.csv'))}
def pred(binary, model, plan):
    subprocess.run([binary, "--model", model, "--cluster", "/tmp/memchk/cluster.json", "--plan", "/tmp/memchk/plan-%s.json" % plan, "--json", "/tmp/memchk/o.json"], capture_output=True, check=True)
    return json.load(open("/tmp/memchk/o.json"))["plans"][0]["groups"][0]["memory_gib"]
out = []
for m, b in cases:
    for p in ("fp32", "fp16", "bf16"):
        r = rows.get((m, b, p))
        if not r or not r['measured_mem']: continue
        meas = float(r['measured_mem']); mj = "/tmp/memchk/%s-b%s.model.json" % (m, b)
        o, n = pred(old_bin, mj, p), pred(new_bin, mj, p)
        out.append(dict(model=m, batch=b, plan=p, measured_gib=meas, run_predicted_gib=float(r['predicted_mem']),
                        sum_gib=round(o, 3), sum_error=round(100 * (o / meas - 1), 1),
                        peak_gib=round(n, 3), peak_error=round(100 * (n / meas - 1), 1)))
with open(out_csv, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(out[0])); w.writeheader(); w.writerows(out)
for r in out: print(r)
