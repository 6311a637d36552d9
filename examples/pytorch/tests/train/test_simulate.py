"""CPU tests of the simulation's torch-only parts (no GPU, no lowbit_torch build): the
stroke-glyph data set, the CNN, the baselines' reduction, short CNN runs of
simulate_dp.py (its CSV, --until, --profile, refused arguments), real_dp.py's two ranks
over gloo against the simulation (fp32 and bf16, row for row), and the batched codec
call against one call per rank (where the codec extension builds). Skipped, saying so,
where torch is not installed."""

import csv
import os
import subprocess
import sys
import tempfile
import unittest

# examples/pytorch/train: the scripts run by path (their imports are of each other)
TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "train")

try:
    import torch
except ImportError:
    torch = None

CPU = None if torch is None else torch.device("cpu")


@unittest.skipIf(torch is None, "torch is not installed")
class StrokesTest(unittest.TestCase):
    def setUp(self):
        from strokes import Strokes

        self.data = Strokes(CPU)

    def test_classes_are_fixed_and_distinct(self):
        from strokes import Strokes

        again = Strokes(CPU)
        self.assertTrue(torch.equal(self.data.figures, again.figures))
        keys = {tuple(f.flatten().tolist()) for f in self.data.figures}
        self.assertEqual(len(keys), self.data.classes)

    def test_a_generator_fixes_the_batch(self):
        x1, y1 = self.data.batch(torch.Generator().manual_seed(7), 16)
        x2, y2 = self.data.batch(torch.Generator().manual_seed(7), 16)
        x3, _ = self.data.batch(torch.Generator().manual_seed(8), 16)
        self.assertTrue(torch.equal(x1, x2) and torch.equal(y1, y2))
        self.assertFalse(torch.equal(x1, x3))

    def test_images_are_normalised_and_labelled(self):
        x, y = self.data.batch(torch.Generator().manual_seed(0), 32)
        self.assertEqual(tuple(x.shape), (32, 1, 32, 32))
        self.assertTrue(torch.isfinite(x).all())
        flat = x.reshape(32, -1)
        self.assertLess(flat.mean(dim=1).abs().max().item(), 1e-4)
        self.assertLess((flat.std(dim=1) - 1).abs().max().item(), 1e-4)
        self.assertTrue(((y >= 0) & (y < self.data.classes)).all())

    def test_noise_free_glyphs_carry_their_figure(self):
        """Without jitter and noise an image is its figure under an affine map: two
        samples of one class overlap far more than samples of two classes, on average."""
        from strokes import Strokes

        clean = Strokes(CPU, jitter=0.0, noise=(0.0, 0.0))
        x, y = clean.batch(torch.Generator().manual_seed(3), 400)
        ink = (x.reshape(400, -1) > 0).float()

        def overlap(a, b):
            return ((a * b).sum() / a.sum()).item()

        first, same = {}, []
        for i, c in enumerate(y.tolist()):
            if c in first:
                same.append(overlap(ink[first[c]], ink[i]))
            else:
                first[c] = i
        other = [overlap(ink[i], ink[i + 1]) for i in range(399) if y[i] != y[i + 1]]
        self.assertGreater(len(same), 20)
        self.assertGreater(sum(same) / len(same), sum(other) / len(other) + 0.1)


@unittest.skipIf(torch is None, "torch is not installed")
class ModelAndReducerTest(unittest.TestCase):
    def test_resnet_shapes(self):
        from simulate_dp import resnet

        net = resnet(8, 1, 100)
        self.assertEqual(tuple(net(torch.zeros(3, 1, 32, 32)).shape), (3, 100))
        # three stages, the second and third halving the side: 32 -> 32 -> 16 -> 8
        feats = net[:-3](torch.zeros(1, 1, 32, 32))
        self.assertEqual(tuple(feats.shape), (1, 32, 8, 8))

    def test_baselines_reduce_as_their_collectives(self):
        from simulate_dp import Reducer, parse_config

        g = torch.randn(4, 1000, generator=torch.Generator().manual_seed(0))
        fp32 = Reducer(parse_config("fp32"), 4, 1000, CPU, 0).reduce(g, 0)
        self.assertTrue(torch.equal(fp32, g.mean(dim=0)))
        bf16 = Reducer(parse_config("bf16"), 4, 1000, CPU, 0).reduce(g, 0)
        want = (g.to(torch.bfloat16).float().sum(dim=0) / 4).to(torch.bfloat16).float()
        self.assertTrue(torch.equal(bf16, want))

    def test_config_names(self):
        from simulate_dp import parse_config

        c = parse_config("b2-full-residual_stage2-stochastic-warm50")
        self.assertEqual((c["bits"], c["grid"], c["feedback"], c["rounding"], c["warm"]),
                         (2, "full", "residual_stage2", "stochastic", 50))
        self.assertEqual(parse_config("b4-zero-damped0.5")["feedback"], "damped0.5")
        for bad in ("b4-zero-none-sideways", "b4-zero-residul", "b3-zero-none", "b4-half-none",
                    "b4-zero", "fp16", "b4-zero-none-warmx"):
            with self.assertRaises(ValueError, msg=bad):
                parse_config(bad)


@unittest.skipIf(torch is None, "torch is not installed")
class RunTest(unittest.TestCase):
    def _run(self, out, *extra):
        cmd = [sys.executable, os.path.join(TRAIN, "simulate_dp.py"), "--device", "cpu",
               "--model", "cnn", "--ranks", "2", "--steps", "4", "--eval-every", "2",
               "--val-seqs", "256", "--batch", "4", "--layers", "1", "--width", "8",
               "--warmup", "1", "--seeds", "0", "1", "--out", out, *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600)

    def test_a_cnn_run_writes_its_rows(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "r.csv")
            for config in ("bf16", "fp32"):  # two processes' worth, one file
                p = self._run(out, "--configs", config)
                self.assertEqual(p.returncode, 0, p.stderr)
            with open(out) as f:
                lines = f.read().splitlines()
            self.assertEqual(lines[0], "config,seed,ranks,step,train_loss,val_loss,seconds")
            self.assertEqual(sum(line.startswith("config,") for line in lines), 1)
            rows = list(csv.DictReader(lines))
            self.assertEqual(sorted((r["config"], r["seed"], r["step"]) for r in rows),
                             sorted((c, s, t) for c in ("bf16", "fp32") for s in "01"
                                    for t in ("2", "4")))
            for r in rows:
                self.assertGreater(float(r["val_loss"]), 0)
                self.assertLess(float(r["val_loss"]), 10)
            # the seed fixes initialisation and data: fp32 and bf16 differ only by rounding
            by = {(r["config"], r["seed"], r["step"]): float(r["val_loss"]) for r in rows}
            self.assertAlmostEqual(by[("bf16", "0", "2")], by[("fp32", "0", "2")], delta=0.05)
            self.assertNotEqual(by[("fp32", "0", "4")], by[("fp32", "1", "4")])

    def test_until_ends_the_schedule_early(self):
        # --until 3 of --steps 4 is the 4-step schedule cut short, not a 3-step schedule:
        # the cosine decay puts step 3's learning rate elsewhere in the two
        with tempfile.TemporaryDirectory() as d:
            rows = {}
            for name, extra in (("whole", ("--steps", "4")), ("part", ("--steps", "4", "--until", "3")),
                                ("short", ("--steps", "3"))):
                out = os.path.join(d, f"{name}.csv")
                p = self._run(out, "--configs", "fp32", "--eval-every", "1", *extra)
                self.assertEqual(p.returncode, 0, p.stderr)
                with open(out) as f:
                    rows[name] = {(r["seed"], r["step"]): r["val_loss"] for r in csv.DictReader(f)}
            self.assertEqual(sorted(rows["part"]), [(s, t) for s in "01" for t in "123"])
            for k in rows["part"]:
                self.assertEqual(rows["part"][k], rows["whole"][k], k)
            self.assertNotEqual(rows["part"][("0", "3")], rows["short"][("0", "3")])
            p = self._run(os.path.join(d, "x.csv"), "--configs", "fp32", "--until", "5")
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("--until must be in 1..--steps (4)", p.stderr)

    def test_a_partial_validation_batch_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            p = self._run(os.path.join(d, "r.csv"), "--configs", "fp32", "--val-seqs", "300")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--val-seqs must be a positive multiple of 256 for --model cnn", p.stderr)

    def test_profile_labels_the_phases(self):
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run(
                [sys.executable, os.path.join(TRAIN, "simulate_dp.py"), "--device", "cpu",
                 "--model", "cnn", "--ranks", "2", "--steps", "11", "--eval-every", "11",
                 "--val-seqs", "256", "--batch", "2", "--layers", "1", "--width", "8",
                 "--seeds", "0", "--configs", "fp32", "--profile", "1",
                 "--out", os.path.join(d, "r.csv")],
                capture_output=True, text=True, timeout=600)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("fp32: steps 10-10", p.stdout)
        for phase in ("batch", "forward and backward", "reduce", "optimizer"):
            self.assertRegex(p.stdout, rf"\n  {phase} +[0-9.]+ ms host  [0-9]+ calls\n")

    def test_graphs_need_a_gpu(self):
        with tempfile.TemporaryDirectory() as d:
            p = self._run(os.path.join(d, "r.csv"), "--configs", "bf16", "--graphs")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--graphs needs --device cuda", p.stderr)



def codec_or_reason():
    """The codec extension (built just in time: needs nvcc), or why it is not at hand."""
    os.environ.setdefault("LOWBIT_TORCH_CODEC_ONLY", "1")  # the codec is all this needs
    try:
        import lowbit_torch

        lowbit_torch.load()
        return None
    except Exception as e:  # noqa: BLE001  (any build failure means: skip, saying why)
        return f"lowbit_torch's codec does not build here: {str(e).splitlines()[0][:200]}"


@unittest.skipIf(torch is None, "torch is not installed")
class BatchedCodecTest(unittest.TestCase):
    """Reducer.qd_ranks puts every rank's row through one encode and decode (nearest
    rounding); it must give the values of one call per rank, feedback state included."""

    def test_one_call_for_all_ranks_is_p_calls(self):
        reason = codec_or_reason()
        if reason:
            self.skipTest(reason)
        from simulate_dp import Reducer, parse_config

        for n in (1000, 1024):  # a partial last block, and whole blocks
            for name in ("b4-zero-none", "b4-zero-residual", "b2-full-residual",
                         "b4-zero-residual_bf16", "b2-full-residual_stage2", "b4-zero-ef21",
                         "b8-full-damped0.5"):
                gen = torch.Generator().manual_seed(n)
                batched = Reducer(parse_config(name), 4, n, CPU, 0)
                per_rank = Reducer(parse_config(name), 4, n, CPU, 0)
                per_rank.batch_codec = False
                for step in range(3):
                    g = torch.randn(4, n, generator=gen) * torch.logspace(-3, 1, 4)[:, None]
                    g[1, :200] = 0  # exact zeros, as unused rows
                    a, b = batched.reduce(g, step), per_rank.reduce(g, step)
                    self.assertTrue(torch.equal(a, b), f"{name}, n={n}, step {step}")
                if batched.e is not None:
                    self.assertTrue(torch.equal(batched.e, per_rank.e), name)


@unittest.skipIf(torch is None, "torch is not installed")
class RealRanksTest(unittest.TestCase):
    """real_dp.py (two processes, DDP over gloo) against the simulation of two ranks: for
    fp32 (DDP's all-reduce) and bf16 (torch's bf16_compress_hook) every row agrees to the
    last digit, so the simulation's data order, initialisation, schedule, optimizer and
    baselines are those of real data parallelism."""

    ARGS = ["--device", "cpu", "--model", "cnn", "--steps", "4", "--eval-every", "2",
            "--val-seqs", "256", "--batch", "4", "--layers", "1", "--width", "8",
            "--warmup", "1", "--seeds", "0", "1", "--configs", "fp32", "bf16"]

    @staticmethod
    def rows(path):
        with open(path, newline="") as f:
            return {(r["config"], r["seed"], r["ranks"], r["step"]):
                    (r["train_loss"], r["val_loss"]) for r in csv.DictReader(f)}

    def test_real_ranks_match_the_simulation(self):
        with tempfile.TemporaryDirectory() as d:
            real, simulated = os.path.join(d, "real.csv"), os.path.join(d, "sim.csv")
            p = subprocess.run([sys.executable, "-m", "torch.distributed.run",
                                "--nproc-per-node", "2", os.path.join(TRAIN, "real_dp.py"),
                                *self.ARGS, "--out", real],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            p = subprocess.run([sys.executable, os.path.join(TRAIN, "simulate_dp.py"),
                                *self.ARGS, "--ranks", "2", "--out", simulated],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            got, want = self.rows(real), self.rows(simulated)
        self.assertEqual(len(want), 2 * 2 * 2)  # configs x seeds x evaluations
        self.assertEqual(got, want)

    def test_refusals(self):
        def refused(*extra):
            p = subprocess.run([sys.executable, os.path.join(TRAIN, "real_dp.py"), *self.ARGS,
                                *extra], capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 2, p.stderr)
            return p.stderr

        self.assertIn("need --device cuda", refused("--configs", "b4-zero-residual"))
        self.assertIn("simulated only", refused("--configs", "b4-zero-damped0.5"))
        self.assertIn("the process group has 1", refused("--ranks", "2"))


class CompareRunsTest(unittest.TestCase):
    """compare_runs.py: a real run against its simulation, row by row."""

    def test_compare_runs_names_the_first_differing_step(self):
        import compare_runs

        head = "config,seed,ranks,step,train_loss,val_loss,seconds\n"
        a = head + "b4,0,2,1,2.00000,,0.1\nb4,0,2,2,1.90000,1.95000,0.2\n" \
                   "b4,0,2,3,1.80000,1.85000,0.3\nfp32,0,2,1,2.00000,,0.1\n"
        b = head + "b4,0,2,1,2.00000,,0.5\nb4,0,2,2,1.90000,1.95000,0.6\n" \
                   "b4,0,2,3,1.80010,1.85000,0.7\nfp32,0,2,1,2.00000,,0.1\n"
        with tempfile.TemporaryDirectory() as d:
            pa, pb = os.path.join(d, "a.csv"), os.path.join(d, "b.csv")
            for path, text in ((pa, a), (pb, b)):
                with open(path, "w") as f:
                    f.write(text)
            rows = {r["config"]: r for r in compare_runs.compare(compare_runs.load(pa),
                                                                 compare_runs.load(pb))}
            self.assertEqual(compare_runs.main([pa, os.path.join(d, "none.csv")]), 2)
        self.assertEqual((rows["fp32"]["identical"], rows["fp32"]["first_differing_step"]),
                         ("yes", ""))
        self.assertEqual((rows["b4"]["identical"], rows["b4"]["first_differing_step"]),
                         ("no", 3))
        self.assertEqual(rows["b4"]["max_abs_train_diff"], "0.00010")
        self.assertEqual(rows["b4"]["steps"], 3)  # seconds are not compared


@unittest.skipIf(torch is None, "torch is not installed")
class SweepTest(unittest.TestCase):
    COMMON = ["--device", "cpu", "--model", "cnn", "--ranks", "2", "--steps", "4",
              "--eval-every", "2", "--val-seqs", "256", "--batch", "4", "--layers", "1",
              "--width", "8", "--warmup", "1", "--seeds", "0", "1"]

    def sweep(self, out, *mine):
        cmd = [sys.executable, os.path.join(TRAIN, "sweep.py"), "--out", out, *mine,
               "--configs", "bf16", "fp32", "--", *self.COMMON]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600)

    def test_sweep_merge_and_refusal(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "sweep.csv")
            p = self.sweep(out)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(out) as f:
                first = f.read()
            self.assertEqual(len(first.splitlines()), 1 + 2 * 2 * 2)  # configs x seeds x evals
            self.assertEqual(os.listdir(d), ["sweep.csv"])  # the parts are gone
            p = self.sweep(out)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("--merge", p.stderr)
            p = self.sweep(out, "--merge")  # a deterministic rerun: the same rows
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(out) as f:
                lines = f.read().splitlines()
            self.assertEqual(sorted(lines), sorted(first.splitlines()))
            lines[1] = lines[1].rsplit(",", 3)[0] + ",9.99999,9.99999,0.0"
            with open(out, "w") as f:
                f.write("\n".join(lines) + "\n")
            p = self.sweep(out, "--merge")
            self.assertEqual(p.returncode, 1)
            self.assertIn("not a deterministic rerun", p.stderr)
            with open(out) as f:
                self.assertIn("9.99999", f.read())  # nothing written
