"""DDP step time by link regime and gradient all-reduce: runs train_gpt_ddp.py under
torchrun once per (regime, comm) and writes one CSV row per run, the form
docs/training/steptime-*.csv take (scripts/training-docs renders it, kind=steptime):

  python3 step_time.py --out steptime.csv --regimes nvlink pcie net \\
      --comms none nccl bf16 lowbit:4 lowbit:2 -- --steps 120 --timed 60 --layers 6

Regimes select NCCL's transport between the GPUs of one machine, as lowbit-perf's do:
nvlink (as the machine is), pcie (NCCL_P2P_DISABLE=1: through host memory) and net
(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: the socket transport over loopback). A comm is
nccl (DDP's default all-reduce), bf16 (torch's bf16_compress_hook), lowbit:<bits> (the
lowbit hook; its defaults otherwise) or none (DDP's no_sync: no all-reduce, the step's
compute alone, from which the communication's share of a step follows). Everything after
"--" goes to every run. lowbit_torch's extension is built (just in time) before the
first run, unless --no-prebuild. A run that fails or prints no step time stops the
script, naming it, after writing the rows before it.
"""

import argparse
import csv
import os
import re
import subprocess
import sys

from sweep import build_extension, split_argv

HERE = os.path.dirname(os.path.abspath(__file__))
FIELDS = ["regime", "comm", "bits", "ranks", "median_ms", "min_ms", "max_ms", "timed",
          "val_loss", "args"]
REGIMES = {
    "nvlink": {},
    "pcie": {"NCCL_P2P_DISABLE": "1"},
    "net": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"},
}
RESULT = re.compile(r"^comm=(\S+) bits=(\S+) ranks=(\d+) group=\S+ steps=\d+ val_loss=(\S+)$",
                    re.M)
SHARED = "the ranks share a GPU"  # train_gpt_ddp.py's note beside a step time of shared GPUs
TIME = re.compile(r"^step time: median (\S+) ms over the last (\d+) steps "
                  r"\(min (\S+), max (\S+)\)$", re.M)


def comm_args(comm):
    """train_gpt_ddp.py's arguments for a comm name; ValueError for an unknown one."""
    if comm in ("none", "nccl", "bf16"):
        return ["--comm", comm]
    m = re.fullmatch(r"lowbit:(\d+)", comm)
    if m:
        return ["--comm", "lowbit", "--bits", m.group(1)]
    raise ValueError(f"unknown comm {comm!r}: none, nccl, bf16 or lowbit:<bits>")


def parse(output, regime, common):
    """The CSV row of one run's output (rank 0's lines); ValueError if they are missing."""
    if SHARED in output:
        raise ValueError("the ranks shared a GPU: step times need a GPU per rank (ranks on "
                         "one GPU time each other, not the link)")
    result, time = RESULT.search(output), TIME.search(output)
    if not result or not time:
        raise ValueError("no result or step-time line in the run's output")
    comm, bits, ranks, val = result.groups()
    median, timed, lo, hi = time.groups()
    return {"regime": regime, "comm": comm, "bits": "" if bits == "-" else bits,
            "ranks": ranks, "median_ms": median, "min_ms": lo, "max_ms": hi,
            "timed": timed, "val_loss": val, "args": " ".join(common)}


def run(regime, comm, common, nproc, timeout, launcher):
    env = dict(os.environ, NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"),
               **REGIMES[regime])
    for k in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"):
        if k not in REGIMES[regime]:
            env.pop(k, None)
    cmd = launcher + [f"--nproc-per-node={nproc}", os.path.join(HERE, "train_gpt_ddp.py")]
    cmd += comm_args(comm) + common
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{regime} {comm}: exit {p.returncode}\n{p.stdout[-2000:]}"
                           f"{p.stderr[-4000:]}")
    try:
        return parse(p.stdout, regime, common)
    except ValueError as e:
        raise RuntimeError(f"{regime} {comm}: {e}\n{p.stdout[-2000:]}") from None


def main(argv):
    mine, common = split_argv(argv)
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    ap.add_argument("--comms", nargs="+", default=["none", "nccl", "bf16", "lowbit:4",
                                                   "lowbit:2"])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--launcher", default="torchrun",
                    help="the launcher's command (split on spaces)")
    ap.add_argument("--no-prebuild", dest="prebuild", action="store_false",
                    help="do not build lowbit_torch's extension before the runs")
    args = ap.parse_args(mine)
    for comm in args.comms:
        try:
            comm_args(comm)
        except ValueError as e:
            ap.error(str(e))
    if args.prebuild and any(c.startswith("lowbit") for c in args.comms):
        try:
            build_extension()
        except subprocess.CalledProcessError:
            print("step_time.py: building lowbit_torch's extension failed (its output above)",
                  file=sys.stderr)
            return 1
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS, lineterminator="\n")
        w.writeheader()
        for regime in args.regimes:
            for comm in args.comms:
                try:
                    row = run(regime, comm, common, args.nproc, args.timeout,
                              args.launcher.split())
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    print(f"step_time.py: {e}", file=sys.stderr)
                    return 1
                w.writerow(row)
                f.flush()
                print(f"{regime:6s} {comm:9s} median {row['median_ms']} ms "
                      f"(min {row['min_ms']}, max {row['max_ms']}) val {row['val_loss']}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
