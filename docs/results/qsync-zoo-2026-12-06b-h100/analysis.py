"""Four readings of this run, from the files beside this script. Run from the repository
root: python3 docs/results/qsync-zoo-2026-12-06b-h100/analysis.py

1-3. The zoo run before's readings (its analysis.py, `readings`) of this run: host noise;
   what a plan's wrapped ops cost the host against the run before (commit 1befb47,
   docs/results/qsync-zoo-2026-12-06-h100/: before the applier hooked whole callers and
   let ops at the ambient enter nothing); whether more host samples would help.
4. The rows by plan group (docs/qsync.md's table under the zoo's): rows, time within
   target, median time error."""
import csv
import importlib.util
import statistics as st

BEFORE = "docs/results/qsync-zoo-2026-12-06-h100/"
UNIFORM = ("fp32", "fp16", "bf16")


def by_plan_group(zoo_csv):
    """Reading 4 of a zoo CSV: rows, time within target and median time error by plan
    group (docs/qsync.md's table under the zoo's)."""
    rows = list(csv.DictReader(open(zoo_csv)))
    within = lambda r: abs(float(r["time_error"])) <= (5 if r["bound"] == "gpu" else 15)
    wraps = lambda r: r["plan"] not in UNIFORM
    # (name, rows kept, the plans whose median errors are shown apart; none: the group's)
    groups = [
        ("uniform fp32 / fp16 / bf16", lambda r: not wraps(r), UNIFORM),
        ("uniform, GPU-bound steps", lambda r: not wraps(r) and r["bound"] == "gpu", ()),
        ("uniform, host-bound steps", lambda r: not wraps(r) and r["bound"] == "host", ()),
        ("mixed-ends / mixed-norms", lambda r: r["plan"].startswith("mixed"),
         ("mixed-ends", "mixed-norms")),
        ("alloc-5pct / alloc-15pct", lambda r: r["plan"].startswith("alloc"),
         ("alloc-5pct", "alloc-15pct")),
        ("plans that wrap ops, GPU-bound steps", lambda r: wraps(r) and r["bound"] == "gpu", ()),
        ("plans that wrap ops, host-bound steps", lambda r: wraps(r) and r["bound"] == "host",
         ()),
    ]
    print("4. rows by plan group: rows, time within target, median time error")
    for name, keep, apart in groups:
        g = [r for r in rows if keep(r)]
        parts = [[r for r in g if r["plan"] == p] for p in apart] or [g]
        medians = " / ".join("%+.1f%%" % st.median(float(r["time_error"]) for r in p)
                             for p in parts)
        print("   %-40s %3d %3d  %s" % (name, len(g), sum(map(within, g)), medians))


if __name__ == "__main__":
    spec = importlib.util.spec_from_file_location("analysis_before", BEFORE + "analysis.py")
    before = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(before)
    before.readings("docs/results/qsync-zoo-2026-12-06b-h100/", ("part1", "part2"),
                    [BEFORE + p + "-run.log" for p in ("part1", "part2", "rerun")])
    by_plan_group("docs/results/qsync-zoo-2026-12-06b-h100/zoo.csv")
