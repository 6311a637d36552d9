"""Tests of train/step_time.py and of the table scripts/training-docs makes of its CSV.
A stand-in launcher (no torch) checks the driver: the environment of each link regime,
the arguments of each comm, the CSV, and a failed run. One real run over gloo on the CPU
(torchrun, train_gpt_ddp.py --device cpu) where torch and transformers are installed."""

import csv
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import step_time

_PYTORCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TRAIN = os.path.join(_PYTORCH, "train")  # the scripts run by path
ROOT = os.path.normpath(os.path.join(_PYTORCH, "..", ".."))  # the repository

# Prints what train_gpt_ddp.py's rank 0 prints; the step time tells the regime and comm
# apart (10 ms, +5 without P2P, +20 without shared memory; +1 per lowbit bit), and a
# comm of "bf16" fails when FAIL_BF16 is set.
LAUNCHER = textwrap.dedent("""
    import os, sys
    a = sys.argv[1:]
    assert a[0] == "--nproc-per-node=2" and a[1].endswith("train_gpt_ddp.py"), a
    comm = a[a.index("--comm") + 1]
    bits = a[a.index("--bits") + 1] if "--bits" in a else "-"
    if comm == "bf16" and os.environ.get("FAIL_BF16"):
        sys.exit("bf16 failed")
    ms = 10 + 5 * (os.environ.get("NCCL_P2P_DISABLE") == "1") \\
        + 20 * (os.environ.get("NCCL_SHM_DISABLE") == "1") + (int(bits) if bits != "-" else 0)
    print("some noise")
    print(f"comm={comm} bits={bits} ranks=2 group=nccl steps=9 val_loss=4.5000")
    print(f"step time: median {ms:.2f} ms over the last 3 steps (min {ms - 1:.2f}, max {ms + 1:.2f})")
""")


def load_training_docs():
    path = os.path.join(ROOT, "scripts", "training-docs")
    loader = importlib.machinery.SourceFileLoader("training_docs", path)
    spec = importlib.util.spec_from_loader("training_docs", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


class StepTimeDriverTest(unittest.TestCase):
    def drive(self, d, *mine, env=None):
        launcher = os.path.join(d, "launcher.py")
        with open(launcher, "w") as f:
            f.write(LAUNCHER)
        out = os.path.join(d, "st.csv")
        cmd = [sys.executable, os.path.join(TRAIN, "step_time.py"), "--out", out,
               "--launcher", f"{sys.executable} {launcher}", "--no-prebuild", *mine, "--",
               "--layers", "1"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, NCCL_P2P_DISABLE="1", **(env or {})))
        with open(out, newline="") as f:
            return p, list(csv.DictReader(f))

    def test_each_regime_and_comm_is_one_row(self):
        with tempfile.TemporaryDirectory() as d:
            p, rows = self.drive(d, "--comms", "none", "nccl", "lowbit:4", "lowbit:2")
            self.assertEqual(p.returncode, 0, p.stderr)
        got = [(r["regime"], r["comm"], r["bits"], r["median_ms"]) for r in rows]
        # nvlink drops the caller's NCCL_P2P_DISABLE; pcie sets it; net adds SHM
        self.assertEqual(got, [
            ("nvlink", "none", "", "10.00"), ("nvlink", "nccl", "", "10.00"),
            ("nvlink", "lowbit", "4", "14.00"), ("nvlink", "lowbit", "2", "12.00"),
            ("pcie", "none", "", "15.00"), ("pcie", "nccl", "", "15.00"),
            ("pcie", "lowbit", "4", "19.00"), ("pcie", "lowbit", "2", "17.00"),
            ("net", "none", "", "35.00"), ("net", "nccl", "", "35.00"),
            ("net", "lowbit", "4", "39.00"), ("net", "lowbit", "2", "37.00")])
        self.assertEqual({r["args"] for r in rows}, {"--layers 1"})
        for r in rows:
            self.assertLess(float(r["min_ms"]), float(r["median_ms"]))
            self.assertLess(float(r["median_ms"]), float(r["max_ms"]))

    def test_a_failed_run_stops_the_driver_keeping_the_rows_before(self):
        with tempfile.TemporaryDirectory() as d:
            p, rows = self.drive(d, "--regimes", "pcie", "--comms", "nccl", "bf16", "none",
                                 env={"FAIL_BF16": "1"})
        self.assertEqual(p.returncode, 1)
        self.assertIn("pcie bf16: exit 1", p.stderr)
        self.assertIn("bf16 failed", p.stderr)
        self.assertEqual([r["comm"] for r in rows], ["nccl"])

    def test_an_unknown_comm_is_refused_before_any_run(self):
        with tempfile.TemporaryDirectory() as d:
            launcher = os.path.join(d, "never")
            p = subprocess.run([sys.executable, os.path.join(TRAIN, "step_time.py"), "--out",
                                os.path.join(d, "st.csv"), "--launcher", launcher,
                                "--comms", "nccl", "lowbit"], capture_output=True, text=True)
            self.assertEqual(p.returncode, 2)
            self.assertIn("unknown comm 'lowbit'", p.stderr)
            self.assertFalse(os.path.exists(os.path.join(d, "st.csv")))

    def test_output_without_a_step_time_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "no result or step-time line"):
            step_time.parse("comm=nccl bits=- ranks=2 group=nccl steps=9 val_loss=4.5\n", "pcie",
                            [])

    def test_a_step_time_of_ranks_sharing_a_gpu_is_refused(self):
        out = ("comm=lowbit bits=4 ranks=2 group=gloo steps=9 val_loss=4.5\n"
               "step time: median 9.00 ms over the last 3 steps (min 8.00, max 10.00); "
               "the ranks share a GPU: not a time of one GPU per rank\n")
        with self.assertRaisesRegex(ValueError, "need a GPU per rank"):
            step_time.parse(out, "pcie", [])


class StepTimeTableTest(unittest.TestCase):
    def test_columns_share_and_speedup(self):
        docs = load_training_docs()
        rows = [("nvlink", "none", "", "10.00"), ("nvlink", "nccl", "", "12.50"),
                ("nvlink", "lowbit", "4", "12.00"), ("pcie", "none", "", "10.00"),
                ("pcie", "nccl", "", "25.00"), ("pcie", "bf16", "", "18.00"),
                ("pcie", "lowbit", "4", "12.50")]
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "st.csv")
            with open(path, "w", newline="") as f:
                w = csv.DictWriter(f, step_time.FIELDS)
                w.writeheader()
                for regime, comm, bits, ms in rows:
                    w.writerow({"regime": regime, "comm": comm, "bits": bits, "ranks": "2",
                                "median_ms": ms, "min_ms": ms, "max_ms": ms, "timed": "3",
                                "val_loss": "4.5", "args": ""})
            table = docs.table_steptime(path, {})
        self.assertEqual(table.splitlines(), [
            "| regime | no all-reduce (ms) | DDP default (ms) | lowbit 4-bit (ms) | "
            "bf16_compress_hook (ms) | communication share | DDP default / lowbit 4-bit |",
            "|---|---|---|---|---|---|---|",
            "| nvlink | 10.00 | 12.50 | 12.00 | - | 20% | 1.04x |",
            "| pcie | 10.00 | 25.00 | 12.50 | 18.00 | 60% | 2.00x |"])


def have(*modules):
    return all(importlib.util.find_spec(m) is not None for m in modules)


@unittest.skipUnless(have("torch", "transformers"), "torch and transformers are not installed")
class StepTimeOnTheCpuTest(unittest.TestCase):
    def test_a_real_run_over_gloo(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "st.csv")
            cmd = [sys.executable, os.path.join(TRAIN, "step_time.py"), "--out", out,
                   "--regimes", "pcie", "--comms", "none", "nccl", "--launcher",
                   f"{sys.executable} -m torch.distributed.run", "--",
                   "--device", "cpu", "--steps", "4", "--timed", "2", "--layers", "1",
                   "--width", "64", "--batch", "2", "--seq", "32", "--val-seqs", "32"]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            with open(out, newline="") as f:
                rows = list(csv.DictReader(f))
        self.assertEqual([(r["comm"], r["ranks"], r["timed"]) for r in rows],
                         [("none", "2", "2"), ("nccl", "2", "2")])
        for r in rows:
            self.assertGreater(float(r["median_ms"]), 0)
            self.assertGreater(float(r["val_loss"]), 0)
