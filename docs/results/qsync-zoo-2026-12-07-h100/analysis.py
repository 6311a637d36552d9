"""Four readings of this run, from the files beside this script. Run from the repository
root: python3 docs/results/qsync-zoo-2026-12-07-h100/analysis.py

1-3. The readings of docs/results/qsync-zoo-2026-12-06-h100/analysis.py (`readings`) of
   this run: host noise; what a plan's wrapped ops cost the host against the run before
   (commit 600add0, docs/results/qsync-zoo-2026-12-06b-h100/); whether more host samples
   would help.
4. The rows by plan group (docs/qsync.md's table under the zoo's), with the run before's
   `by_plan_group`."""
import importlib.util


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FIRST = "docs/results/qsync-zoo-2026-12-06-h100/"
BEFORE = "docs/results/qsync-zoo-2026-12-06b-h100/"
load(FIRST + "analysis.py", "analysis_first").readings(
    "docs/results/qsync-zoo-2026-12-07-h100/", ("part1", "part2"),
    [BEFORE + p + "-run.log" for p in ("part1", "part2")])
load(BEFORE + "analysis.py", "analysis_before").by_plan_group("docs/qsync/zoo-2026-12-07-h100.csv")
