"""Runs simulate_dp.py once per configuration, the processes side by side (on one GPU
they share it), and merges their rows into one CSV, the form docs/training/*.csv take:

  python3 sweep.py --out sim-p4.csv --configs bf16 b4-zero-residual b2-full-residual \\
      -- --ranks 4 --steps 3000 --eval-every 250 --seeds 0 1 2 --graphs --budget 500

Everything after "--" goes to every process. Each process writes a file of its own
(rows are not locked) beside --out; the merged file lists the configurations in order of
first appearance, then rank count, step and seed. --merge adds to an existing --out, so
that a later, longer run extends a table: where both hold a row (the same configuration,
ranks, seed and step) their losses must agree to the last digit, as a deterministic rerun
does, or nothing is written and the sweep fails, naming the rows.
"""

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FIELDS = ["config", "seed", "ranks", "step", "train_loss", "val_loss", "seconds"]


def key(row):
    return (row["config"], int(row["ranks"]), int(row["seed"]), int(row["step"]))


def read(path):
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f)]


def merge(tables):
    """One row per key; raises ValueError listing the keys whose losses disagree."""
    rows, order, clashes = {}, [], []
    for table in tables:
        for r in table:
            k = key(r)
            if r["config"] not in order:
                order.append(r["config"])
            old = rows.get(k)
            if old is None:
                rows[k] = r
            elif (old["train_loss"], old["val_loss"]) != (r["train_loss"], r["val_loss"]):
                clashes.append(f"{k}: {old['val_loss']} vs {r['val_loss']}")
    if clashes:
        raise ValueError("rows that disagree (not a deterministic rerun):\n  " +
                         "\n  ".join(clashes))
    rank = {c: i for i, c in enumerate(order)}
    return sorted(rows.values(), key=lambda r: (rank[r["config"]], int(r["ranks"]),
                                                int(r["step"]), int(r["seed"])))


def write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows({k: r[k] for k in FIELDS} for r in rows)


def build_extension():
    """Builds lowbit_torch's extension (just in time) once, before the processes start:
    otherwise each would wait on torch's build lock, the wait counted in its --budget."""
    # the lowbit_torch simulate_dp.py imports: installed, or on PYTHONPATH
    subprocess.run([sys.executable, "-c", "import lowbit_torch; lowbit_torch.load()"],
                   check=True)


def split_argv(argv):
    """(the script's own arguments, those after "--" that go to every run)."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def main(argv):
    mine, common = split_argv(argv)
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--merge", action="store_true", help="add to an existing --out")
    args = ap.parse_args(mine)
    for flag in ("--configs", "--out"):
        if flag in common:
            ap.error(f"{flag} is the sweep's own: give it before --")
    if os.path.exists(args.out) and not args.merge:
        ap.error(f"{args.out} exists: --merge adds to it")

    if any(c not in ("bf16", "fp32") for c in args.configs):
        try:
            build_extension()
        except subprocess.CalledProcessError:
            print("sweep: lowbit_torch's extension did not build (its output is above)",
                  file=sys.stderr)
            return 1
    parts_dir = tempfile.mkdtemp(prefix="sweep-", dir=os.path.dirname(os.path.abspath(args.out)))
    runs = []
    t0 = time.time()
    for i, config in enumerate(args.configs):
        part = os.path.join(parts_dir, f"{i}.csv")
        log = open(os.path.join(parts_dir, f"{i}.log"), "w")
        cmd = [sys.executable, os.path.join(HERE, "simulate_dp.py"), *common,
               "--configs", config, "--out", part]
        runs.append((config, part, log, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))
    failed = []
    for config, part, log, p in runs:
        rc = p.wait()
        log.close()
        if rc != 0:
            failed.append((config, log.name, rc))

    parts = {config: read(part) if os.path.exists(part) else [] for config, part, _, _ in runs}
    old = [read(args.out)] if args.merge and os.path.exists(args.out) else []
    try:
        rows = merge(old + list(parts.values()))
    except ValueError as e:
        print(f"sweep: {e}\n(the parts are kept in {parts_dir})", file=sys.stderr)
        return 1
    write(args.out, rows)
    for config, table in parts.items():
        steps = [int(r["step"]) for r in table]
        print(f"{config}: to step {max(steps) if steps else '-'}")
    print(f"{len(rows)} rows in {args.out} after {time.time() - t0:.0f} s")
    for config, log, rc in failed:
        with open(log) as f:
            tail = f.read()[-2000:]
        print(f"sweep: {config} failed (exit {rc}); the end of {log}:\n{tail}", file=sys.stderr)
    if failed:
        return 1
    for _, part, log, _ in runs:
        for f in (part, log.name):
            if os.path.exists(f):
                os.remove(f)
    os.rmdir(parts_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
