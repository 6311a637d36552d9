"""Compares two runs' CSVs of simulate_dp.py's rows (e.g. real_dp.py on real ranks against
simulate_dp.py's simulation of the same ranks), row by row: per (config, seed, ranks)
whether every step's train and validation loss agree to the digit written, else the
first step where they differ and the largest difference after it.

  python3 compare_runs.py real.csv sim.csv [--out compare.csv]

Exit status 0 where both runs have the same rows (agreeing or not; the output says
which), 2 where a file is unreadable or the runs share no (config, seed, ranks)."""

import argparse
import csv
import sys

KEY = ("config", "seed", "ranks")
FIELDS = ["config", "seed", "ranks", "steps", "identical", "first_differing_step",
          "max_abs_train_diff", "max_abs_val_diff", "a_final_train", "b_final_train"]


def load(path):
    """{(config, seed, ranks): {step: (train_loss, val_loss)}} of a run's CSV."""
    runs = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            runs.setdefault(tuple(r[k] for k in KEY), {})[int(r["step"])] = (
                r["train_loss"], r["val_loss"])
    return runs


def _diff(x, y):
    if x == y:
        return 0.0
    try:
        return abs(float(x) - float(y))
    except ValueError:  # one empty (no evaluation at that step)
        return float("inf")


def compare(a, b):
    """One row per (config, seed, ranks) the two runs share, over the steps both have."""
    rows = []
    for key in sorted(set(a) & set(b)):
        steps = sorted(set(a[key]) & set(b[key]))
        first, dt, dv = None, 0.0, 0.0
        for s in steps:
            (ta, va), (tb, vb) = a[key][s], b[key][s]
            if (ta, va) != (tb, vb) and first is None:
                first = s
            if first is not None:
                dt, dv = max(dt, _diff(ta, tb)), max(dv, _diff(va, vb))
        last = steps[-1] if steps else None
        rows.append(dict(zip(FIELDS, [
            *key, len(steps), "yes" if first is None else "no",
            "" if first is None else first, f"{dt:.5f}", f"{dv:.5f}",
            a[key][last][0] if last else "", b[key][last][0] if last else ""])))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="a run's CSV (e.g. real_dp.py's)")
    ap.add_argument("b", help="the other's (e.g. simulate_dp.py's)")
    ap.add_argument("--out", help="also write the comparison as CSV")
    args = ap.parse_args(argv)
    try:
        a, b = load(args.a), load(args.b)
    except (OSError, KeyError, ValueError) as e:
        print(f"compare_runs: {e}", file=sys.stderr)
        return 2
    rows = compare(a, b)
    if not rows:
        print("compare_runs: the two runs share no (config, seed, ranks)", file=sys.stderr)
        return 2
    for r in rows:
        verdict = ("identical" if r["identical"] == "yes" else
                   f"first differs at step {r['first_differing_step']} (max |train| diff "
                   f"{r['max_abs_train_diff']}, |val| {r['max_abs_val_diff']})")
        print(f"{r['config']} seed {r['seed']} P={r['ranks']}: {r['steps']} steps, {verdict}")
    only = sorted(set(a) ^ set(b))
    for key in only:
        print(f"only in {'a' if key in a else 'b'}: {' '.join(key)}")
    if args.out:
        with open(args.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
