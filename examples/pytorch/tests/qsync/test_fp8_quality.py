"""The fp8 training-quality runner (qsync/fp8_quality.py) and its tables
(scripts/qsync-fp8-table): the tables and the goal's answer on hand-made CSV fixtures
(tests/qsync/data/fp8_*_fixture.csv: made-up figures, not a measurement), the tasks, the
fp8 menu given to lowbit-plan, and the runner's --smoke mode end to end on the CPU (a
check of the code: CPU times, fp8 GEMMs only where the CPU build has torch._scaled_mm).
With LOWBIT_PLAN set to a built lowbit-plan, the smoke run makes the allocator's plan too."""

import csv
import importlib.machinery
import importlib.util
import math
import os
import subprocess
import sys
import tempfile
import unittest

from qsync import fp8_quality as fq

try:
    import torch
    from qsync import fp8
except ImportError:
    torch = fp8 = None

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", "..", "..", ".."))
SCRIPT = os.path.join(REPO, "scripts", "qsync-fp8-table")
QUALITY = os.path.join(HERE, "data", "fp8_quality_fixture.csv")
GEMM = os.path.join(HERE, "data", "fp8_gemm_fixture.csv")


def table_module():
    loader = importlib.machinery.SourceFileLoader("qsync_fp8_table_test", SCRIPT)
    spec = importlib.util.spec_from_loader("qsync_fp8_table_test", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class Tables(unittest.TestCase):
    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True,
                              text=True)

    def test_tables_from_the_fixtures_merge_and_check(self):
        with tempfile.TemporaryDirectory() as d:
            with open(QUALITY) as f:
                lines = f.read().splitlines()
            first, second = os.path.join(d, "a.csv"), os.path.join(d, "b.csv")
            with open(first, "w") as f:  # the second model as a second part
                f.write("\n".join(lines[:7]) + "\n")
            with open(second, "w") as f:
                f.write("\n".join([lines[0]] + lines[7:]) + "\n")
            merged = os.path.join(d, "quality.csv")
            r = self.run_script("--merge", first, second, "-o", merged)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(read(merged), read(QUALITY))
            r = self.run_script("--merge", first, GEMM, "-o", os.path.join(d, "mixed.csv"))
            self.assertEqual(r.returncode, 2)
            os.symlink(GEMM, os.path.join(d, "gemm.csv"))
            doc = os.path.join(d, "doc.md")
            with open(doc, "w") as f:
                f.write("before\n<!-- fp8-table: quality.csv -->\nstale\n<!-- end fp8-table -->\n"
                        "mid\n<!-- fp8-gemm-table: gemm.csv -->\n<!-- end fp8-gemm-table -->\n"
                        "after\n")
            self.assertEqual(self.run_script("--check", doc).returncode, 1)
            self.assertEqual(self.run_script(doc).returncode, 0)
            self.assertEqual(self.run_script("--check", doc).returncode, 0)
            with open(doc) as f:
                text = f.read()
        self.assertTrue(text.startswith("before\n") and text.endswith("after\n"))
        self.assertIn("\nmid\n", text)
        self.assertIn("| fixture-lm | 8 | alloc-fp8-80pct | 40 | 2 | 86.00 | +17.4% | 75% | "
                      "2.0150 ± 0.0071 | +0.0100 ± 0.0000 |", text)
        self.assertIn("| fixture-vit | 64 | fp8 | 24 | 1 | 40.00 | +25.0% | 100% | 1.1000 | "
                      "+0.1000 |", text)
        self.assertIn("- fixture-lm, batch 8: `alloc-fp8-80pct` keeps 75% of uniform fp8's "
                      "speed-up (goal: at least 70%) at a loss gap of +0.0100 against uniform "
                      "fp8's +0.0400 (goal: at most +0.0200): **yes**.", text)
        self.assertIn("keeps 30% of uniform fp8's speed-up", text)
        self.assertIn("(goal: at most +0.0500): **no** (speed, loss).", text)
        self.assertIn("Not run: fixture-vit batch 64 bf16/1, fp8/1, alloc-fp8-80pct/1: "
                      "skipped (budget).", text)
        self.assertIn("| fixture-lm | 8 | 4096 x 1024 x 4096 | 16 | 1.60x | 1.50x | 1.10x | "
                      "1.20x (bf16 0.900 ms) |", text)
        self.assertIn("from `quality.csv` (2000-01-01, commit fixture, made-up figures", text)

    def test_predicted_step_times_beside_the_measured_where_the_csv_has_them(self):
        t = table_module()
        rows = read(QUALITY)
        self.assertNotIn("predicted", t.quality_table(rows, "q.csv"))  # older CSVs: as before
        for r in rows:
            r["predicted_ms"] = {"bf16": "101.000", "fp8": "76.000"}.get(r["plan"], "")
        text = t.quality_table(rows, "q.csv")
        self.assertIn("| step ms | predicted ms | error | vs bf16 |", text)
        self.assertIn("| fixture-lm | 8 | fp8 | 56 | 2 | 81.00 | 76.00 | -6.2% | +24.7% |", text)
        self.assertIn("| fixture-lm | 8 | alloc-fp8-80pct | 40 | 2 | 86.00 | - | - | +17.4% |",
                      text)
        with tempfile.TemporaryDirectory() as d:  # --merge keeps the column
            part = os.path.join(d, "p.csv")
            with open(part, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
            merged = os.path.join(d, "m.csv")
            self.assertEqual(self.run_script("--merge", part, "-o", merged).returncode, 0)
            self.assertEqual(read(merged)[1]["predicted_ms"], "76.000")

    def test_qsync_docs_counts_the_tables_as_citing_their_csvs(self):
        loader = importlib.machinery.SourceFileLoader(
            "qsync_docs_test", os.path.join(REPO, "scripts", "qsync-docs"))
        spec = importlib.util.spec_from_loader("qsync_docs_test", loader)
        docs = importlib.util.module_from_spec(spec)
        loader.exec_module(docs)
        text = "<!-- fp8-table: q.csv -->\nx\n<!-- fp8-gemm-table: g.csv -->\n"
        self.assertEqual(docs.FP8_MARKER.findall(text), ["q.csv", "g.csv"])

    def test_a_missing_column_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            bad = os.path.join(d, "bad.csv")
            with open(bad, "w") as f:
                f.write("model,batch,plan\nx,1,bf16\n")
            r = self.run_script("--merge", bad, "-o", os.path.join(d, "o.csv"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("missing column", r.stderr)


class Goal(unittest.TestCase):
    def setUp(self):
        self.t = table_module()

    def rows(self, runs):
        """Rows of one model from {plan: [(step_ms, final_loss, loss_gap), ...]}."""
        out = []
        for plan, rs in runs.items():
            for seed, (ms, loss, gap) in enumerate(rs):
                out.append(dict(model="m", batch=8, plan=plan, seed=seed, steps=10,
                                final_loss=loss, loss_gap=gap, step_ms=ms, fp8_ops=1,
                                status="ok", date="", commit="", hardware=""))
        return out

    def goal(self, runs):
        return self.t.goal(self.t.summarize(self.rows(runs))[("m", "8")])

    def test_the_goal_at_its_edges(self):
        base = {"bf16": [(100, "2.0", "+0.0")], "fp8": [(80, "2.1", "+0.1")]}
        g = self.goal(dict(base, **{"alloc-fp8-80pct": [(86, "2.05", "+0.05")]}))
        self.assertEqual((g["answer"], round(g["share"]), g["why"]), ("yes", 70, ""))
        g = self.goal(dict(base, **{"alloc-fp8-80pct": [(86.2, "2.0501", "+0.0501")]}))
        self.assertEqual((g["answer"], g["why"]), ("no", "speed, loss"))
        g = self.goal(dict(base, **{"alloc-fp8-80pct": [(85, "nan", "nan")]}))  # diverged
        self.assertEqual((g["answer"], g["why"]), ("no", "loss"))
        g = self.goal(dict(base, fp8=[(101, "2.1", "+0.1")],
                           **{"alloc-fp8-80pct": [(90, "2.0", "+0.0")]}))
        self.assertEqual(g["answer"], "not decided")
        self.assertIn("not faster than bf16", g["why"])
        g = self.goal(base)
        self.assertEqual(g["answer"], "not decided")

    def test_a_gap_within_the_seeds_spread_is_noted(self):
        g = self.goal({"bf16": [(100, "2.0", "+0.0")] * 2,
                       "fp8": [(80, "2.1", "+0.02"), (80, "2.1", "-0.01")],
                       "alloc-fp8-80pct": [(84, "2.0", "+0.0")] * 2})
        self.assertEqual(g["answer"], "yes")  # 80% kept, gap 0 <= half of +0.005
        self.assertIn("within its spread over the seeds", g["note"])

    def test_an_fp8_predicted_no_faster_than_bf16_is_noted(self):
        rows = self.rows({"bf16": [(100, "2.0", "+0.0")] * 2,
                          "fp8": [(99.8, "2.1", "+0.1")] * 2,
                          "alloc-fp8-80pct": [(100, "2.0", "+0.0")] * 2})
        for r in rows:
            r["predicted_ms"] = {"bf16": 103.0, "fp8": 104.0}.get(r["plan"], 103.0)
        g = self.t.goal(self.t.summarize(rows)[("m", "8")])
        self.assertEqual((g["answer"], g["why"]), ("no", "speed"))
        self.assertIn("predicted uniform fp8 (104.00 ms) no faster than bf16 (103.00 ms)",
                      g["note"])
        for r in rows:
            r["predicted_ms"] = {"bf16": 103.0, "fp8": 90.0}.get(r["plan"], 95.0)
        self.assertEqual(self.t.goal(self.t.summarize(rows)[("m", "8")])["note"], "")

    def test_the_runner_prints_the_scripts_table(self):
        self.assertEqual(os.path.realpath(fq.TABLE_SCRIPT), os.path.realpath(SCRIPT))
        self.assertTrue(hasattr(fq.table_module(), "quality_table"))


class Arguments(unittest.TestCase):
    def test_parts_defaults_and_refusals(self):
        one = fq.parse_args(["--out", "x", "--part", "1/2"])
        two = fq.parse_args(["--out", "x", "--part", "2/2"])
        self.assertEqual(one.models + two.models, ["hf-llama-4k", "hf-gpt2-2k", "timm-vit-g14"])
        self.assertEqual((one.steps, one.seeds, one.last_k, one.targets), (200, [0, 1, 2], 20,
                                                                          [80.0]))
        a = fq.parse_args(["--out", "x", "--seeds", "3,5", "--batch", "hf-gpt2=16"])
        self.assertEqual((a.seeds, a.batch), ([3, 5], {"hf-gpt2": 16}))
        self.assertEqual(fq.parse_args(["--out", "x", "--seeds", "2,"]).seeds, [2])
        for bad in (["--models", "nope"], ["--part", "3/2"], ["--fp8-standin"],
                    ["--last-k", "300"], ["--targets", "120"], ["--batch", "x"],
                    ["--seeds", ","]):
            with self.assertRaises(SystemExit, msg=bad):
                fq.parse_args(["--out", "x"] + bad)

    def test_budget_estimates_from_the_closest_kind_done(self):
        b = fq.Budget(100.0)
        fq.T0 = fq.time.time() - 49  # 49 s spent
        self.assertTrue(b.allows("train", "m", "bf16"))  # nothing done: no estimate
        b.done(40.0, "train", "m", "bf16")
        b.done(60.0, "train", "m", "fp8")
        self.assertTrue(b.allows("train", "m", "bf16"))  # 49 + 40 <= 100
        self.assertFalse(b.allows("train", "m", "fp8"))  # 49 + 60
        self.assertTrue(b.allows("train", "m", "alloc"))  # the model's mean: 49 + 50
        self.assertFalse(fq.Budget(10.0).allows("profile"))  # already past
        self.assertTrue(fq.Budget(0).allows("profile"))  # no budget


@unittest.skipIf(torch is None, "needs torch")
class Tasks(unittest.TestCase):
    def test_the_chain_is_deterministic_per_seed_and_learnable(self):
        task = fq.MarkovTask(torch, vocab=128, seq=16, states=1024, successors=4)
        a, b, c = task.stream(64, 0), task.stream(64, 0), task.stream(64, 1)
        self.assertTrue(torch.equal(a, b))
        self.assertFalse(torch.equal(a, c))
        self.assertEqual(task.states, 64)  # at most half the vocabulary
        lut = torch.full((128,), -1, dtype=torch.long)
        lut[task.tokens] = torch.arange(task.states)
        states = lut[task.stream(4000, 2)]
        self.assertGreaterEqual(int(states.min()), 0)  # only the chain's tokens
        x, y = states[:, :-1].flatten(), states[:, 1:].flatten()
        self.assertTrue(bool((task.succ[x] == y[:, None]).any(1).all()))  # the chain's steps
        counts = torch.zeros(task.states, task.states).index_put_(
            (x, y), torch.ones(len(x)), accumulate=True)
        # what a bigram table learns from the stream: near the chain's entropy, far below
        # the uniform loss
        p = counts / counts.sum(1, keepdim=True).clamp_min(1)
        nll = -(counts * p.clamp_min(1e-12).log()).sum() / counts.sum()
        self.assertLess(float(nll), task.entropy + 0.1)
        self.assertLess(task.entropy, 0.7 * math.log(task.states))

    def test_the_teachers_labels(self):
        task = fq.TeacherTask(torch, side=64, classes=10, pool=8)
        x1, y1 = task.batches(32, 2, 0, "cpu")(0)
        x2, y2 = task.batches(32, 2, 0, "cpu")(0)
        self.assertTrue(torch.equal(x1, x2) and torch.equal(y1, y2))
        self.assertTrue(0 <= int(y1.min()) and int(y1.max()) < 10)
        self.assertGreater(len(set(y1.tolist())), 3)  # not one class

    def test_the_fp8_menu_keeps_fp8_to_linears_it_can_run(self):
        from qsync import export as ex
        from qsync import qsync_model as qm

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.norm = torch.nn.Linear(32, 32), torch.nn.LayerNorm(32)
                self.b = torch.nn.Linear(32, 10)  # 10 outputs: not a multiple of 16

            def forward(self, x):
                return self.b(self.norm(self.a(x)))

        net = Net()
        x = torch.randn(16, 32)
        mj = qm.model_json(ex.record_ops(net, lambda: net(x).sum(), "fp32",
                                         device_type="cpu"), "net")
        menu = fq.v.fp8_menu_model(net, mj, ("bf16", "fp32"))
        allowed = {o["name"]: o.get("allowed") for o in menu["ops"]}
        self.assertEqual(allowed, {"a": None, "norm": ["bf16", "fp32"], "b": ["bf16", "fp32"]})
        self.assertNotIn("allowed", mj["ops"][1])  # a copy
        # validate.py --fp8's menu: every precision but fp8 for what fp8 cannot run
        self.assertEqual(fq.v.fp8_menu_model(net, mj)["ops"][2]["allowed"],
                         ["fp16", "bf16", "fp32"])

    def test_standin_makes_every_fp8_bf16(self):
        plan = {"default": "fp8", "ops": {"a": "fp8", "b": "fp32"}}
        self.assertEqual(fq.standin(plan), {"default": "bf16", "ops": {"a": "bf16", "b": "fp32"}})
        self.assertEqual(plan["ops"]["a"], "fp8")


@unittest.skipIf(torch is None, "needs torch")
class Smoke(unittest.TestCase):
    def smoke(self, d, *extra):
        fq.main(["--smoke", "--models", "tiny-lm", "--steps", "3", "--seeds", "2",
                 "--out", d, "--gemm-iters", "1"] + list(extra))
        return read(os.path.join(d, "quality.csv")), read(os.path.join(d, "gemm.csv"))

    def test_runs_rows_and_gemms(self):
        with tempfile.TemporaryDirectory() as d:
            rows, gemm = self.smoke(d)
        self.assertEqual([(r["plan"], r["seed"]) for r in rows],
                         [("bf16", "0"), ("fp8", "0"), ("bf16", "1"), ("fp8", "1")])
        for r in rows:
            self.assertTrue(r["status"].startswith("ok"), r)
            self.assertTrue(math.isfinite(float(r["final_loss"])))
            self.assertGreater(float(r["step_ms"]), 0)
            self.assertIn("smoke: not a measurement", r["hardware"])
        self.assertEqual({r["loss_gap"] for r in rows if r["plan"] == "bf16"}, {"+0.00000"})
        fp8_runs = fp8.runs_on("cpu")
        self.assertEqual({r["fp8_ops"] for r in rows if r["plan"] == "fp8"},
                         {"9" if fp8_runs else "0"})  # 2 blocks x 4 linears + the head
        self.assertEqual({(r["m"], r["k"], r["n"]) for r in gemm},
                         {("64", "32", "96"), ("64", "32", "32"), ("64", "32", "128"),
                          ("64", "128", "32")})
        self.assertEqual({r["gemm"] for r in gemm}, {"forward", "dgrad", "wgrad", "linear"})

    def test_same_weights_and_data_for_every_plan(self):
        from qsync import export as ex
        from qsync import qsync_model as qm

        args = fq.parse_args(["--smoke", "--out", "x", "--steps", "3", "--last-k", "1"])
        task, loss_fn = fq.make_task(torch, "tiny-lm", True)
        model = fq.build_model(torch, "tiny-lm", True, 0, "cpu")
        init = {k: t.clone() for k, t in model.state_dict().items()}
        first = task.batches(4, 1, 0, "cpu")(0)
        mj = qm.model_json(ex.record_ops(model, lambda: loss_fn(model, first), "fp32",
                                         device_type="cpu"), "tiny")

        def run(plan, seed):
            return fq.train_run(torch, args, model, init, lambda: task.batches(4, 3, seed, "cpu"),
                                loss_fn, plan, mj, "cpu", seed, 1e-3)[3]
        a, b = run(qm.uniform_plan("bf16"), 0), run(qm.uniform_plan("bf16"), 0)
        self.assertEqual(a, b)  # a run is a function of its plan and seed
        self.assertNotEqual(run(qm.uniform_plan("bf16"), 1), a)
        if fp8.runs_on("cpu"):  # fp8 starts where bf16 does and then departs
            c = run(qm.uniform_plan("fp8"), 0)
            self.assertAlmostEqual(c[0], a[0], delta=0.05)
            self.assertNotEqual(c, a)
        fresh = fq.build_model(torch, "tiny-lm", True, 0, "cpu").state_dict()
        self.assertTrue(all(torch.equal(fresh[k], init[k]) for k in init))

    def test_the_measured_models_at_their_tiny_size(self):
        try:
            import torchvision  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as e:
            self.skipTest("needs transformers and torchvision (%s)" % e)
        with tempfile.TemporaryDirectory() as d:
            rows, _ = self.smoke(d, "--models", "hf-llama,tv-vit-b16", "--seeds", "1")
        self.assertEqual([(r["model"], r["plan"], r["status"]) for r in rows],
                         [(m, p, "ok") for m in ("hf-llama", "tv-vit-b16")
                          for p in ("bf16", "fp8")])
        if fp8.runs_on("cpu"):
            # Llama: 2 layers x 7 linears + the head; the ViT: its MLPs' linears only
            # (nn.MultiheadAttention's projections are function calls, not fp8's)
            self.assertEqual([r["fp8_ops"] for r in rows if r["plan"] == "fp8"], ["15", "4"])

    def test_standins_are_labelled(self):
        with tempfile.TemporaryDirectory() as d:
            rows, _ = self.smoke(d, "--fp8-standin", "--seeds", "1")
        bf16, f8 = rows
        self.assertEqual(f8["status"], "ok (fp8 ops ran as bf16 stand-ins)")
        self.assertEqual((f8["fp8_ops"], f8["final_loss"]), ("0", bf16["final_loss"]))
        self.assertIn("fp8 as bf16 stand-ins", f8["hardware"])

    def test_a_spent_budget_skips_and_lists_everything(self):
        with tempfile.TemporaryDirectory() as d:
            rows, gemm = self.smoke(d, "--budget-s", "0.000001")
        self.assertEqual(len(rows), 4)
        self.assertEqual({r["status"] for r in rows}, {"skipped (budget)"})
        self.assertEqual(gemm, [])

    @unittest.skipUnless(os.environ.get("LOWBIT_PLAN"), "set LOWBIT_PLAN to a lowbit-plan binary")
    def test_the_allocators_plan_from_validates_profiles(self):
        with tempfile.TemporaryDirectory() as d:
            rows, _ = self.smoke(d, "--seeds", "1", "--lowbit-plan", os.environ["LOWBIT_PLAN"])
            names = sorted(os.listdir(d))
            plan = fq.qm.read_json(os.path.join(d, "plans",
                                                "tiny-lm-b4_alloc-fp8-80pct.lowbit.json"))
            menu = fq.qm.read_json(os.path.join(d, "tiny-lm-b4.fp8menu.model.json"))
            traces = sorted(os.listdir(os.path.join(d, "traces")))
        self.assertEqual([r["plan"] for r in rows], ["bf16", "fp8", "alloc-fp8-80pct"])
        self.assertTrue(all(r["status"] == "ok" for r in rows), rows)
        # every plan's row carries lowbit-plan's prediction; the allocator's is its plan's
        self.assertTrue(all(float(r["predicted_ms"]) > 0 for r in rows), rows)
        self.assertAlmostEqual(float(rows[2]["predicted_ms"]), plan["predicted_iteration_ms"],
                               places=3)
        self.assertIn("tiny-lm-b4.model.json", names)  # validate.run_case's
        self.assertIn("tiny-lm-b4_fp8.json.gz", traces)
        self.assertNotIn("tiny-lm-b4_fp16.json.gz", traces)  # no fp16 in this menu
        self.assertIn("target_ms", plan)
        allowed = {o["name"]: o.get("allowed") for o in menu["ops"]}
        self.assertEqual(allowed["tok"], ["bf16", "fp32"])
        self.assertIsNone(allowed["head"])
        self.assertNotIn("fp16", set(plan["groups"][0]["ops"].values()))

    @unittest.skipUnless(os.environ.get("LOWBIT_PLAN"), "set LOWBIT_PLAN to a lowbit-plan binary")
    def test_from_an_earlier_runs_profiles_or_plans(self):
        binary = os.environ["LOWBIT_PLAN"]
        with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as d, \
                tempfile.TemporaryDirectory() as e:
            self.smoke(first, "--seeds", "1", "--steps", "2", "--last-k", "1", "--lowbit-plan",
                       binary)
            replanned, _ = self.smoke(d, "--seeds", "1", "--from", first, "--lowbit-plan", binary)
            taken, _ = self.smoke(e, "--seeds", "1", "--from", first)
            self.assertNotIn("traces", os.listdir(d))  # nothing profiled again
            fq.main(["--smoke", "--models", "tiny-lm", "--steps", "2", "--seeds", "1",
                     "--out", e, "--from", first, "--batch", "tiny-lm=2"])
            missing = read(os.path.join(e, "quality.csv"))
        for rows in (replanned, taken):
            self.assertEqual([(r["plan"], r["status"]) for r in rows],
                             [("bf16", "ok"), ("fp8", "ok"), ("alloc-fp8-80pct", "ok")])
        self.assertTrue(all(r["status"].startswith("failed (profile): RuntimeError: --from")
                            for r in missing), missing)  # no tiny-lm-b2 there


if __name__ == "__main__":
    unittest.main()


def test_the_allocators_device_is_the_gpu_the_profiles_ran_on():
    from qsync import qsync_model as qm

    assert qm.device_base("NVIDIA H100 80GB HBM3") == "H100"
    assert qm.device_base("NVIDIA H200") == "H200"
    assert qm.device_base("NVIDIA A100-SXM4-80GB") == "A100"
    assert qm.device_base("cpu (smoke)") == "H200"  # a name it knows none of: the default
    assert qm.device_base("", default="T4") == "T4"
