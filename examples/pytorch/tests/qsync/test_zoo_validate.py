"""Torch-free tests of validate.py's zoo mode (cases, parts, the zoo CSV, failures) and
of scripts/qsync-zoo-table (the table generated from a zoo CSV), on a hand-made CSV
fixture (tests/qsync/data/zoo_fixture.csv: made-up figures, not a measurement)."""

import csv
import os
import subprocess
import sys
import tempfile
import unittest
import weakref

from qsync import validate as v
from qsync import zoo

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", "..", "..", ".."))
SCRIPT = os.path.join(REPO, "scripts", "qsync-zoo-table")
FIXTURE = os.path.join(HERE, "data", "zoo_fixture.csv")


def write_csv(path, fields, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


class ZooCases(unittest.TestCase):
    def test_every_model_twice_and_the_parts_split_it(self):
        every = v.zoo_cases()
        self.assertEqual(len(every), 2 * len(zoo.CASES))
        one, two = v.zoo_cases((1, 2)), v.zoo_cases((2, 2))
        self.assertEqual(set(one) | set(two), set(every))
        self.assertFalse(set(one) & set(two))
        for spec in every.values():  # a model's two cases in one part
            self.assertEqual(spec["zoo"] + "-b%d" % spec["batch"] in one,
                             any(s["zoo"] == spec["zoo"] for s in one.values()))
        self.assertEqual(every["hf-gpt2-b8"]["regime"], "gpu")
        self.assertEqual(every["hf-gpt2-b1"]["iters"], v.ZOO_EFFORT["host"]["iters"])

    def test_arguments(self):
        a = v.parse_args(["--out", "x", "--zoo", "--part", "2/2"])
        self.assertEqual(a.part, (2, 2))
        self.assertEqual(set(a.cases.split(",")), set(v.zoo_cases((2, 2))))
        with self.assertRaises(SystemExit):
            v.parse_args(["--out", "x", "--zoo", "--part", "3/2"])
        with self.assertRaises(SystemExit):
            v.parse_args(["--out", "x", "--zoo", "--cases", "cnn-b256"])

    def test_a_model_of_ones_own(self):
        a = v.parse_args(["--out", "x", "--model", "qsync.zoo:make", "--batch", "1,8"])
        self.assertEqual(a.cases.split(","), ["make-b1", "make-b8"])
        self.assertEqual(a.case_specs["make-b1"]["regime"], "host")
        self.assertEqual(a.case_specs["make-b8"]["batch"], 8)
        with tempfile.TemporaryDirectory() as d:  # a script of one's own, by its path
            script = os.path.join(d, "my_net.py")
            with open(script, "w") as f:
                f.write("def make(batch, device):\n    return None, None\n")
            a = v.parse_args(["--out", "x", "--model", script + ":make", "--batch", "2"])
            self.assertEqual(list(a.case_specs), ["make-b2"])
            with open(os.path.join(d, "broken.py"), "w") as f:
                f.write("def make(:\n")
            for bad in (os.path.join(d, "broken.py:make"), os.path.join(d, "none.py:make"),
                        script + ":other"):
                with self.assertRaises(SystemExit, msg=bad):
                    v.parse_args(["--out", "x", "--model", bad])
        for bad in (["--model", "qsync.zoo"], ["--model", "qsync.zoo:nothing_here"],
                    ["--model", "no_such_module:make"], ["--model", "qsync.zoo:CASES"],
                    ["--model", "qsync.zoo:make", "--batch", "0"],
                    ["--model", "qsync.zoo:make", "--zoo"]):
            with self.assertRaises(SystemExit, msg=bad):
                v.parse_args(["--out", "x"] + bad)

    def test_seven_plans_with_the_allocators_two(self):
        self.assertEqual([k for k, _ in v.ALLOC_SLACKS], ["alloc-5pct", "alloc-15pct"])


class ZooCsv(unittest.TestCase):
    def test_rows_targets_and_failures(self):
        with tempfile.TemporaryDirectory() as out:
            v.qm.write_json(os.path.join(out, "env.json"), {
                "gpu": "Fixture GPU", "torch": "0.0", "date": "2000-01-01", "commit": "abc"})
            base = {"iters": "10", "iter_ms_mean": "", "iter_ms_min": "", "iter_ms_max": "",
                    "plan_summary": ""}
            measured = [
                dict(base, case="m-b64/bf16", model="m-b64", plan="bf16", batch="64",
                     iter_ms_median="20.0", peak_gib="2.0", host_ms_median="5.0",
                     zoo_model="m", regime="gpu"),
                dict(base, case="m-b1/bf16", model="m-b1", plan="bf16", batch="1",
                     iter_ms_median="10.0", peak_gib="1.0", host_ms_median="9.5",
                     zoo_model="m", regime="host"),
                dict(base, case="m-b1/fp32", model="m-b1", plan="fp32", batch="1",
                     iter_ms_median="10.0", peak_gib="1.0", host_ms_median="9.5",
                     zoo_model="m", regime="host")]
            predicted = {"m-b64/bf16": {"iteration_ms": 21.5, "memory_gib": 2.1},
                         "m-b1/bf16": {"iteration_ms": 11.2, "memory_gib": 1.0}}
            rows = v.qm.validation_rows(predicted, measured)
            v.write_failures(out, [{"case": "x-b8", "model": "x", "batch": 8,
                                    "stage": "export", "error": "RuntimeError: boom"}])
            path = v.write_zoo_csv(out, measured, rows, {"m-b1/fp32": "lowbit-plan failed"})
            with open(path) as f:
                got = list(csv.DictReader(f))
        self.assertEqual([r["model"] for r in got], ["m", "m", "m", "x"])
        gpu, host, unpredicted, failed = got
        self.assertEqual(gpu["bound"], "gpu")  # host 5 of 20 ms
        self.assertEqual(gpu["within_target"], "no (time)")  # +7.5% > 5%
        self.assertEqual(host["bound"], "host")  # host 9.5 of 10 ms
        self.assertEqual(host["within_target"], "yes")  # +12% <= 15%
        self.assertEqual(host["time_error"], "+12.00")
        self.assertTrue(unpredicted["within_target"].startswith("failed (predict)"))
        self.assertEqual(failed["within_target"], "failed (export): RuntimeError: boom")
        self.assertEqual((gpu["date"], gpu["commit"], gpu["hardware"]),
                         ("2000-01-01", "abc", "Fixture GPU, torch 0.0"))


class Heap(unittest.TestCase):
    def test_settled_objects_stay_frozen_while_steps_are_timed(self):
        import gc

        class Node:
            pass

        before = gc.get_freeze_count()
        try:
            v.settle_heap()
            frozen = gc.get_freeze_count()
            self.assertGreater(frozen, 0)
            cycle = Node()
            cycle.self = cycle  # garbage after the settle: collector_off's collection frees it
            probe = weakref.ref(cycle)
            del cycle
            with v.qm.collector_off():
                self.assertIsNone(probe())
                self.assertFalse(gc.isenabled())
                self.assertEqual(gc.get_freeze_count(), frozen)
            self.assertTrue(gc.isenabled())
            self.assertEqual(gc.get_freeze_count(), frozen)
        finally:
            if not before:
                gc.unfreeze()


class ZooTable(unittest.TestCase):
    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True,
                              text=True)

    def test_table_from_the_fixture_and_check(self):
        with tempfile.TemporaryDirectory() as d:
            merged = os.path.join(d, "zoo.csv")
            part = os.path.join(d, "part.csv")
            with open(FIXTURE) as f:
                lines = f.read().splitlines()
            with open(part, "w") as f:  # the last row as a second part
                f.write("\n".join([lines[0], lines[-1]]) + "\n")
            with open(os.path.join(d, "first.csv"), "w") as f:
                f.write("\n".join(lines[:-1]) + "\n")
            r = self.run_script("--merge", os.path.join(d, "first.csv"), part, "-o", merged)
            self.assertEqual(r.returncode, 0, r.stderr)
            doc = os.path.join(d, "doc.md")
            with open(doc, "w") as f:
                f.write("before\n<!-- zoo-table: zoo.csv -->\nstale\n<!-- end zoo-table -->\nafter\n")
            self.assertEqual(self.run_script("--check", doc).returncode, 1)
            self.assertEqual(self.run_script(doc).returncode, 0)
            self.assertEqual(self.run_script("--check", doc).returncode, 0)
            with open(doc) as f:
                text = f.read()
        self.assertIn("| fixture-net | 64 | gpu | bf16 | 30.00 | 27.00 | +11.1 | 5% | 3.00 | "
                      "3.00 | +0.0 | no (time) |", text)
        self.assertIn("| fixture-net | 1 | host | bf16 | 12.00 | 11.00 | +9.1 | 15% |", text)
        self.assertIn("Time within target on 2 of 3 rows", text)
        self.assertIn("memory within 10% on 2 of 3", text)
        self.assertIn("Worst time: fixture-net batch 64 bf16, +11.1%.", text)
        self.assertIn("fixture-broken batch 8: failed (export): RuntimeError: fixture", text)
        self.assertTrue(text.startswith("before\n") and text.endswith("after\n"))
        self.assertNotIn("By card", text)  # one card: its count is the total

    def test_a_run_over_two_cards_counts_each(self):
        with open(FIXTURE) as f:
            rows = list(csv.DictReader(f))
        rows[1]["hardware"] = "Second fixture GPU"  # the gpu bf16 row, a time miss
        with tempfile.TemporaryDirectory() as d:
            write_csv(os.path.join(d, "zoo.csv"), list(rows[0]), rows)
            doc = os.path.join(d, "doc.md")
            with open(doc, "w") as f:
                f.write("<!-- zoo-table: zoo.csv -->\n<!-- end zoo-table -->\n")
            self.assertEqual(self.run_script(doc).returncode, 0)
            with open(doc) as f:
                text = f.read()
        self.assertIn("By card: Second fixture GPU: time within target on 0 of 1 rows; "
                      "hand-made fixture (not a measurement): time within target on 2 of 2 "
                      "rows.", text)

    def test_a_case_run_again_replaces_its_skipped_row(self):
        with open(FIXTURE) as f:
            rows = list(csv.DictReader(f))
        fields = list(rows[0])
        measured_rows = [r for r in rows if r["measured_ms"]]
        case = (measured_rows[0]["model"], measured_rows[0]["batch"])
        skipped = dict(rows[0], bound="", plan="", predicted_ms="", measured_ms="",
                       time_error="", predicted_mem="", measured_mem="", mem_error="",
                       within_target="failed (skipped (budget)): not run")
        again = [r for r in measured_rows if (r["model"], r["batch"]) == case]
        others = [r for r in rows if (r["model"], r["batch"]) != case]
        with tempfile.TemporaryDirectory() as d:
            parts = [os.path.join(d, n) for n in ("p1.csv", "p2.csv", "o.csv")]
            write_csv(parts[0], fields, others + [skipped])
            write_csv(parts[1], fields, again)
            r = self.run_script("--merge", parts[0], parts[1], "-o", parts[2])
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(parts[2]) as f:
                got = list(csv.DictReader(f))
        self.assertEqual(len(got), len(others) + len(again))
        self.assertFalse(any(g["within_target"].startswith("failed (skipped")
                             for g in got if (g["model"], g["batch"]) == case))
        # a case no part measured keeps its row
        self.assertTrue(any(g["within_target"].startswith("failed (export)") for g in got))

    def test_a_missing_column_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            bad = os.path.join(d, "bad.csv")
            write_csv(bad, ["model"], [{"model": "x"}])
            r = self.run_script("--merge", bad, "-o", os.path.join(d, "o.csv"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("missing column", r.stderr)


if __name__ == "__main__":
    unittest.main()
