"""Tests of the torch-free half of the exporter (qsync.qsync_model, and validate's
predict mode).

With LOWBIT_PLAN set to a built lowbit-plan, the exported model JSON, a hand-written
trace and a plan also go through the planner (the schema both sides agree on)."""

import csv
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

from qsync import qsync_model as qm

# examples/pytorch: where `python3 -m qsync.validate` finds the package
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def ev(cat, name, ts, dur, tid=1, **args):
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}
    if args:
        e["args"] = args
    return e


# Two leaf modules, conv then a ReLU module called twice (shared), with one glue add; one
# profiler step, backward ranges on the autograd thread, an optimizer range.
TRACE = {"traceEvents": [
    ev("user_annotation", "ProfilerStep#4", 0, 1000),
    ev("user_annotation", "conv", 10, 50),
    ev("cuda_runtime", "cudaLaunchKernel", 20, 5, correlation=1),
    ev("user_annotation", "relu", 70, 20),
    ev("cuda_runtime", "cudaLaunchKernel", 75, 5, correlation=2),
    ev("user_annotation", "relu#2", 100, 20),
    ev("cuda_runtime", "cudaLaunchKernel", 105, 5, correlation=3),
    ev("user_annotation", "relu#2.backward", 300, 20, tid=2),
    ev("user_annotation", "relu.backward", 330, 20, tid=2),
    ev("user_annotation", "conv.backward", 360, 40, tid=2),
    ev("cuda_runtime", "cudaLaunchKernel", 370, 5, tid=2, correlation=4),
    ev("user_annotation", "Optimizer.step#Adam.step", 800, 50),
    ev("cuda_runtime", "cudaLaunchKernel", 810, 5, correlation=5),
    ev("cuda_runtime", "cudaDeviceSynchronize", 900, 90),
    ev("kernel", "implicit_gemm", 30, 100, tid=7, correlation=1),
    ev("kernel", "relu_kernel", 130, 10, tid=7, correlation=2),
    ev("kernel", "relu_kernel", 140, 10, tid=7, correlation=3),
    ev("kernel", "conv_wgrad", 380, 150, tid=7, correlation=4),
    ev("kernel", "adam", 820, 20, tid=7, correlation=5),
]}

RECORDS = {
    "conv": {"module_class": "Conv2d", "param_numel": 1728, "output_numel": 4096,
             "flops": 2e6, "bytes": 3e4, "inputs": [], "order": 0,
             "saved_bytes": {"fp32": 12288, "bf16": 6144},
             "input_cast_bytes": {"fp32": 0.0, "bf16": 6144},
             "workspace_bytes": {"fp32": 2.0**20, "bf16": 0.0},
             "stats": {"weight_norm": 1.0, "input_numel": 3072, "grad_output_absmax": None}},
    "relu": {"module_class": "ReLU", "param_numel": 0, "output_numel": 4096,
             "inputs": ["conv", "conv"], "order": 1, "saved_bytes": {"fp32": 16384},
             "code_saved_bytes": {"fp32": 4096}},
    "relu#2": {"module_class": "ReLU", "param_numel": 0, "output_numel": 4096,
               "inputs": ["relu", "nowhere"], "via_code": ["relu", "nowhere"], "order": 2,
               "saved_bytes": {"fp32": 0}},
}


class ModelJson(unittest.TestCase):
    def test_kinds(self):
        self.assertEqual(qm.kind_of("BatchNorm2d"), "batch_norm")
        self.assertEqual(qm.kind_of("Conv2d"), "conv")
        self.assertEqual(qm.kind_of("LayerNorm"), "layer_norm")
        self.assertEqual(qm.kind_of("NonDynamicallyQuantizableLinear"), "linear")
        self.assertEqual(qm.kind_of("Dropout"), "other")
        self.assertEqual(qm.call_name("layer.relu", 0), "layer.relu")
        self.assertEqual(qm.call_name("layer.relu", 1), "layer.relu#2")
        self.assertEqual(qm.module_of("layer.relu#2"), "layer.relu")
        self.assertEqual(qm.module_of("model"), "")

    def test_forward_ranges(self):
        self.assertEqual(qm.forward_ranges(TRACE),
                         ["conv", "relu", "relu#2", "Optimizer.step#Adam.step"])
        with self.assertRaises(ValueError):
            qm.forward_ranges({"events": []})

    def test_model_json(self):
        m = qm.model_json(RECORDS, "tiny", trace=TRACE)
        self.assertEqual([o["name"] for o in m["ops"]], ["conv", "relu", "relu#2"])
        self.assertEqual(m["casts"], "ambient")  # as apply_plan.py casts
        conv, relu, relu2 = m["ops"]
        self.assertEqual(conv["kind"], "conv")
        self.assertEqual(conv["saved_numel"], 3072)
        self.assertEqual(conv["saved_bytes"], {"fp32": 12288.0, "bf16": 6144.0})
        self.assertEqual(conv["stats"], {"weight_norm": 1.0, "input_numel": 3072.0})
        self.assertEqual(conv["input_cast_bytes"], {"bf16": 6144.0})  # zeros left out
        self.assertNotIn("input_cast_bytes", relu)
        self.assertEqual(relu["code_saved_bytes"], {"fp32": 4096.0})
        self.assertNotIn("code_saved_bytes", conv)
        self.assertEqual(conv["workspace_bytes"], {"fp32": 2.0**20})  # scratch, zeros left out
        self.assertNotIn("workspace_bytes", relu)
        self.assertEqual(relu["inputs"], ["conv"])  # deduplicated
        self.assertEqual(relu2["inputs"], ["relu"])  # unknown producers dropped
        self.assertNotIn("via_code", relu)  # only the producer's own output
        self.assertEqual(relu2["via_code"], ["relu"])  # through code, known ops only
        self.assertNotIn("untimed", m)
        self.assertEqual(qm.missing_ranges(TRACE, m), [])
        # An op the trace never timed is kept (its parameters cost memory) and listed.
        recs = dict(RECORDS, head={"module_class": "Linear", "param_numel": 10, "order": 3,
                                   "inputs": ["relu#2"]})
        m2 = qm.model_json(recs, "tiny", trace=TRACE)
        self.assertEqual(m2["untimed"], ["head"])
        self.assertEqual(qm.missing_ranges(TRACE, m2), ["head"])

    def test_model_json_rejects_another_program(self):
        recs = {k: dict(v) for k, v in RECORDS.items()}
        recs["conv"]["order"], recs["relu#2"]["order"] = 2, 0
        with self.assertRaises(ValueError):
            qm.model_json(recs, "tiny", trace=TRACE)
        with self.assertRaises(ValueError):
            qm.model_json(RECORDS, "tiny", trace={"traceEvents": []})
        bad = dict(RECORDS, x={"kind": "warp", "order": 9})
        with self.assertRaises(ValueError):
            qm.model_json(bad, "tiny")

    def test_plans(self):
        m = qm.model_json(RECORDS, "tiny")
        mixed = qm.mixed_plans(m)
        self.assertEqual(mixed["mixed-ends"], {"default": "bf16", "ops": {"conv": "fp32"}})
        self.assertEqual(mixed["mixed-norms"]["ops"], {"conv": "fp16"})
        self.assertEqual(qm.plan_precisions({"default": "bf16"}, m), {"conv": "bf16"})
        self.assertEqual(qm.plan_precisions({"groups": [{"ops": {"conv": "fp16"}}]}, m),
                         {"conv": "fp16"})
        self.assertEqual(qm.ambient_precision({"a": "bf16", "b": "bf16", "c": "fp32"}), "bf16")
        # ties go to the higher precision, as lowbit-plan's dominant_precision does
        self.assertEqual(qm.ambient_precision({"a": "bf16", "b": "fp32"}), "fp32")
        self.assertEqual(qm.ambient_precision({"a": "bf16", "b": "fp16"}), "bf16")
        recs = dict(RECORDS, fc={"module_class": "Linear", "param_numel": 10, "order": 3,
                                 "inputs": ["relu#2"]})
        m2 = qm.model_json(recs, "tiny")
        self.assertEqual(qm.resolve_precisions({"conv": "fp32", "fc": "bf16"}, m2),
                         {"conv": "fp32", "relu": "fp32", "relu#2": "fp32", "fc": "bf16"})
        # fc is at the ambient bf16 but fed fp32 (through the ReLUs): wrapped to cast.
        self.assertEqual(qm.ops_to_wrap({"conv": "fp32", "fc": "bf16"}, m2, "bf16"),
                         {"conv": "fp32", "fc": "bf16"})
        self.assertEqual(qm.ops_to_wrap({"conv": "bf16", "fc": "bf16"}, m2, "bf16"), {})
        self.assertEqual(qm.ops_to_wrap({"conv": "fp32", "fc": "fp32"}, m2, "fp32"), {})
        # A parameter-free op fed by no op (a detection model's input transform) runs in
        # the step's context: at the applier's ambient, so a uniform plan wraps nothing;
        # QSync's per-edge rule keeps fp32.
        first = dict(RECORDS, pre={"module_class": "Flatten", "param_numel": 0, "order": -1,
                                   "output_numel": 3072, "inputs": []})
        first["conv"] = dict(RECORDS["conv"], inputs=["pre"])
        m3 = qm.model_json(first, "tiny")
        self.assertEqual(qm.resolve_precisions({"conv": "bf16"}, m3, graph_input="bf16")["pre"],
                         "bf16")
        self.assertEqual(qm.resolve_precisions({"conv": "bf16"}, m3)["pre"], "fp32")
        self.assertEqual(qm.ops_to_wrap({"conv": "bf16"}, m3, "bf16"), {})
        self.assertEqual(qm.ambient_precision({}), "fp32")

    def test_table(self):
        pred = {"m/fp32": {"iteration_ms": 10.6, "memory_gib": 2.0},
                "b1/fp32": {"iteration_ms": 11.0, "memory_gib": 1.0}}
        rows = qm.validation_rows(pred, [
            {"case": "m/fp32", "batch": "256", "iter_ms_median": "10", "peak_gib": "2.5",
             "iter_ms_min": "9", "iter_ms_max": "12", "host_ms_median": "3"},
            {"case": "b1/fp32", "batch": "1", "iter_ms_median": "10", "peak_gib": "1"},
            {"case": "m/x", "batch": "256", "iter_ms_median": "1", "peak_gib": "1"}])
        self.assertEqual(len(rows), 2)
        self.assertAlmostEqual(rows[0]["time_err_pct"], 6.0)
        self.assertFalse(rows[0]["time_ok"])  # 5% target
        self.assertTrue(rows[1]["time_ok"])  # host-bound: 15%
        self.assertAlmostEqual(rows[0]["mem_err_pct"], -20.0)
        self.assertEqual((rows[0]["meas_min_ms"], rows[0]["meas_max_ms"], rows[0]["meas_host_ms"]),
                         (9.0, 12.0, 3.0))
        self.assertNotIn("meas_min_ms", rows[1])
        self.assertFalse(rows[0]["mem_ok"])
        table = qm.markdown_table(rows)
        self.assertIn("| m/fp32 | 10.60 | 10.00 | +6.0 | no (5%) | 2.00 | 2.50 | -20.0 | no (10%) |",
                      table)
        self.assertIn("| b1/fp32 | 11.00 | 10.00 | +10.0 | yes (15%) |", table)

    def test_host_trace(self):
        t = qm.host_trace([2.0, 4.0])
        steps = [e for e in t["traceEvents"] if e["name"].startswith("ProfilerStep#")]
        self.assertEqual([e["dur"] for e in steps], [2000.0, 4000.0])
        self.assertLess(steps[0]["ts"] + steps[0]["dur"], steps[1]["ts"])

    def test_json_files(self):
        with tempfile.TemporaryDirectory() as d:
            p = qm.write_json(os.path.join(d, "t.json.gz"), TRACE)
            self.assertEqual(qm.read_json(p), TRACE)
            plain = qm.gunzip_to(p, os.path.join(d))
            self.assertTrue(plain.endswith("t.json"))
            with open(plain) as f:
                self.assertEqual(json.load(f), TRACE)

    @unittest.skipUnless(os.environ.get("LOWBIT_PLAN"), "set LOWBIT_PLAN to a lowbit-plan binary")
    def test_through_lowbit_plan(self):
        with tempfile.TemporaryDirectory() as d:
            model = qm.write_json(os.path.join(d, "m.json"), qm.model_json(RECORDS, "tiny"))
            trace = qm.write_json(os.path.join(d, "t.json"), TRACE)
            cluster = qm.write_json(os.path.join(d, "c.json"), qm.cluster_json())
            plan = qm.write_json(os.path.join(d, "p.json"), qm.uniform_plan("fp32"))
            out = os.path.join(d, "pred.json")
            run = [os.environ["LOWBIT_PLAN"], "--model", model, "--cluster", cluster,
                   "--traces", "fp32=" + trace, "--plan", plan, "--json", out]
            subprocess.run(run, check=True, capture_output=True)
            pred = qm.read_json(out)["plans"][0]
            # GPU: conv 0.1 + 0.15 (wgrad), relus 0.01 each, tail adam 0.02 = 0.29 ms of
            # kernels; the host (0.91 ms a step, less the 0.09 ms sync) is the bound.
            self.assertAlmostEqual(pred["iteration_ms"], 0.91, places=6)
            self.assertGreater(pred["groups"][0]["memory_gib"], 0)
            # Host steps timed without a profiler (0.5 ms) replace the host total.
            host = qm.write_json(os.path.join(d, "h.json"), qm.host_trace([0.5, 0.5]))
            subprocess.run(run + ["--plain-traces", "fp32=" + host], check=True,
                           capture_output=True)
            self.assertAlmostEqual(qm.read_json(out)["plans"][0]["iteration_ms"], 0.5, places=6)


def _has_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


class HostTruth(unittest.TestCase):
    def test_host_truth_traces(self):
        # validate.py --predict gives lowbit-plan the median of the host samples that
        # --host-truth names, from OUT/host_times.json.
        from qsync import validate
        with tempfile.TemporaryDirectory() as out:
            os.makedirs(os.path.join(out, "traces"))
            qm.write_json(os.path.join(out, "host_times.json"), {"m": {"precisions": {
                "fp32": {"profiling": [1.0, 2.0, 3.0], "rounds": [[10.0, 12.0], [11.0]]}},
                "plans": {}}})

            def given(kind):
                self.assertEqual(validate.host_truth_traces(out, kind), "host_" + kind)
                t = qm.read_json(os.path.join(out, "traces", "m_fp32_host_%s.json.gz" % kind))
                return [e["dur"] / 1000.0 for e in t["traceEvents"]]

            self.assertEqual(given("rounds"), [11.0])
            self.assertEqual(given("profiling"), [2.0])
            self.assertEqual(given("all"), [3.0 + (10.0 - 3.0) / 2])  # median of 6
        with tempfile.TemporaryDirectory() as out:  # an older OUT: the profiling trace
            self.assertEqual(validate.host_truth_traces(out, "rounds"), "host")

    def test_host_truth_with_phases(self):
        # The samples' host phases (forward, backward) go with their median step, as the
        # qsync.forward and qsync.backward ranges lowbit-plan reads (trace_loader.hpp).
        from qsync import validate
        with tempfile.TemporaryDirectory() as out:
            os.makedirs(os.path.join(out, "traces"))
            qm.write_json(os.path.join(out, "host_times.json"), {"m": {"precisions": {
                "fp32": {"profiling": [1.0, 2.0, 3.0], "rounds": [[10.0, 12.0], [11.0]],
                         "phases": {"profiling": [[0.5, 0.3], [1.0, 0.6], [1.5, 0.9]],
                                    "rounds": [[[6.0, 3.0], [7.0, 4.0]], [[6.5, 2.0]]]}}},
                "plans": {}}})

            self.assertEqual(validate.host_truth_traces(out, "rounds"), "host_rounds")
            t = qm.read_json(os.path.join(out, "traces", "m_fp32_host_rounds.json.gz"))
            self.assertEqual([e["name"] for e in t["traceEvents"]], ["ProfilerStep#0"])

            def phases(kind):
                validate.host_truth_traces(out, kind, phases=True)
                t = qm.read_json(os.path.join(out, "traces", "m_fp32_host_%s.json.gz" % kind))
                return {e["name"]: (e["ts"], e["dur"] / 1000.0) for e in t["traceEvents"]}

            r = phases("rounds")
            self.assertEqual(r["ProfilerStep#0"], (0.0, 11.0))
            self.assertEqual(r["qsync.forward"], (0.0, 6.5))
            self.assertEqual(r["qsync.backward"], (6500.0, 3.0))
            self.assertEqual(phases("profiling")["qsync.backward"][1], 0.6)
            self.assertEqual(phases("all")["qsync.forward"][1], 1.5 + (6.0 - 1.5) / 2)
        self.assertNotIn("qsync.forward", str(qm.host_trace([2.0])))  # no phases: none


class Smoke(unittest.TestCase):
    @unittest.skipUnless(_has_torch() and os.environ.get("LOWBIT_PLAN"),
                         "needs torch and LOWBIT_PLAN")
    def test_validate_smoke(self):
        """The whole pipeline on tiny models on the CPU (checks code, measures nothing)."""
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([sys.executable, "-m", "qsync.validate",
                                "--smoke", "--out", d, "--lowbit-plan", os.environ["LOWBIT_PLAN"],
                                "--iters", "2", "--warmup", "1", "--profile-steps", "1",
                                "--host-iters", "2"], capture_output=True, text=True, cwd=ROOT)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            self.assertIn("| cnn-b256/mixed-norms |", r.stdout)
            self.assertTrue(os.path.exists(os.path.join(d, "validation.csv")))

    @unittest.skipUnless(_has_torch() and os.environ.get("LOWBIT_PLAN"),
                         "needs torch and LOWBIT_PLAN")
    def test_validate_smoke_on_a_model_of_ones_own(self):
        """--model MODULE:FUNCTION: a user's module (a frozen embedding, a branch never
        taken), exported, planned, applied, measured and predicted like the built-in
        cases."""
        own = textwrap.dedent("""
            import torch
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.emb = nn.Embedding(50, 16)
                    self.emb.weight.requires_grad_(False)
                    self.body = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
                    self.spare = nn.Linear(4, 4)

                def forward(self, ids):
                    return self.body(self.emb(ids)).mean(1)

            def make(batch, device):
                torch.manual_seed(0)
                model = Net().to(device)
                ids = torch.randint(0, 50, (batch, 8), device=device)
                y = torch.randint(0, 4, (batch,), device=device)
                return model, lambda: nn.functional.cross_entropy(model(ids), y)
            """)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "my_net.py"), "w") as f:
                f.write(own)
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                [d, ROOT, os.environ.get("PYTHONPATH", "")]))
            out = os.path.join(d, "out")
            r = subprocess.run([sys.executable, "-m", "qsync.validate", "--smoke", "--out", out,
                                "--model", "my_net:make", "--batch", "1,4",
                                "--lowbit-plan", os.environ["LOWBIT_PLAN"], "--iters", "2",
                                "--warmup", "1", "--profile-steps", "1", "--host-iters", "2",
                                "--trace-plans"],
                               capture_output=True, text=True, cwd=ROOT, env=env)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            self.assertIn("| make-b4/bf16 |", r.stdout)
            # --trace-plans: each mixed plan's own trace, and plan_gap's table from it
            self.assertTrue(os.path.exists(os.path.join(
                out, "traces", "make-b4_plan_mixed-ends.json.gz")))
            self.assertFalse(os.path.exists(os.path.join(out, "traces",
                                                         "make-b4_plan_bf16.json.gz")))
            g = subprocess.run([sys.executable, "-m", "qsync.plan_gap", out, "make-b4",
                                "mixed-ends", "--lowbit-plan", os.environ["LOWBIT_PLAN"],
                                "--csv", os.path.join(d, "gap.csv")],
                               capture_output=True, text=True, cwd=ROOT, env=env)
            self.assertEqual(g.returncode, 0, g.stderr[-3000:])
            self.assertIn("| total |", g.stdout)
            with open(os.path.join(d, "gap.csv")) as f:
                gap_ops = {row["op"] for row in csv.DictReader(f)}
            self.assertIn("body.0", gap_ops)
            self.assertIn("tail", gap_ops)
            missing = subprocess.run([sys.executable, "-m", "qsync.plan_gap", out, "make-b4",
                                      "no-such-plan", "--lowbit-plan",
                                      os.environ["LOWBIT_PLAN"]],
                                     capture_output=True, text=True, cwd=ROOT, env=env)
            self.assertEqual(missing.returncode, 2)
            self.assertIn("--trace-plans", missing.stderr)
            self.assertIn("| make-b1/fp32 |", r.stdout)
            mj = qm.read_json(os.path.join(out, "make-b4.model.json"))
            self.assertEqual(mj["unused_params"]["names"], ["spare.weight", "spare.bias"])
            self.assertEqual(mj["ops"][0]["frozen_numel"], 50 * 16)


