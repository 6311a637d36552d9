"""switch_probe.py's plumbing on the CPU (its numbers there mean nothing for a GPU): the
fit, the in-situ counts of casts and wrapped ops, and the constants reaching lowbit-plan
through validate.py's cluster JSON."""

import gzip
import json
import os
import subprocess
import tempfile
import unittest

from qsync import switch_probe as sp
from qsync import validate as v


def _has_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


class Fit(unittest.TestCase):
    def test_exact_line_is_recovered(self):
        pts = [(float(n), 2e-9 * n + 3e-3) for n in (1e3, 4e3, 1.6e4, 1e6, 6.4e7)]
        a, b = sp.fit_linear(pts)
        self.assertAlmostEqual(a / 2e-9, 1.0, places=9)
        self.assertAlmostEqual(b / 3e-3, 1.0, places=9)


class WrapCosts(unittest.TestCase):
    def test_the_switches_less_their_casts_over_the_wrapped_ops(self):
        situ = {"wrapped": 4.0, "forward_casts": 6.0, "backward_casts": 5.0,
                "forward": {"switch_ms": 1.0}, "backward": {"switch_ms": 0.5}}
        fwd, bwd = sp.wrap_costs(situ, {"cast_forward_ms": 0.1, "cast_backward_ms": 0.04})
        self.assertAlmostEqual(fwd, (1.0 - 0.6) / 4)
        self.assertAlmostEqual(bwd, (0.5 - 0.2) / 4)
        # a backward cast measured below 0 prices the casts at nothing, not less
        _, bwd = sp.wrap_costs(situ, {"cast_forward_ms": 0.1, "cast_backward_ms": -0.01})
        self.assertAlmostEqual(bwd, 0.5 / 4)


class ClusterJson(unittest.TestCase):
    def test_probe_constants_go_into_the_device(self):
        probe = {"date": "2026-01-01", "gpu": "test", "device": {
            "cast_fits": {"float_to_float": {"a_ms": 1e-9, "b_ms": 2e-3}},
            "cast_host_ms": 0.02, "cast_backward_host_ms": 0.01, "wrap_host_ms": 0.03,
            "wrap_backward_host_ms": 0.015, "function_call_host_ms": 0.004}}
        with tempfile.TemporaryDirectory() as out:
            os.makedirs(os.path.join(out, "traces"))
            with gzip.open(os.path.join(out, "traces", "c_fp32.json.gz"), "wt") as f:
                f.write("{}")
            v.plan_args(out, "c", out, gz=True)
            with open(os.path.join(out, "cluster.json")) as f:
                self.assertNotIn("wrap_host_ms", json.load(f)["groups"][0]["device"])
            with open(os.path.join(out, v.SWITCH_PROBE), "w") as f:
                json.dump(probe, f)
            v.plan_args(out, "c", out, gz=True)
            with open(os.path.join(out, "cluster.json")) as f:
                device = json.load(f)["groups"][0]["device"]
            self.assertEqual(device["base"], "H200")
            for k, val in probe["device"].items():
                self.assertEqual(device[k], val)


@unittest.skipUnless(_has_torch(), "needs torch")
class InSitu(unittest.TestCase):
    def test_counts_of_the_applied_chain(self):
        """Every fp32 op among bf16 ones: two wrapped ops (it and its consumer), a cast in
        and out forward, both gradients' casts backward."""
        import torch

        r = sp.in_situ(torch, "cpu", True, blocks=7, width=8, batch=2)
        self.assertEqual(r["fp32_ops"], 2)  # ops 2 and 5
        self.assertAlmostEqual(r["forward_casts"], 4.0)
        self.assertAlmostEqual(r["backward_casts"], 4.0)
        self.assertAlmostEqual(r["wrapped"], 4.0)
        for what in ("forward", "backward"):
            self.assertIn("switch_ms", r[what])

    def test_mode_call_times_both_sides_at_both_counts(self):
        import torch

        r = sp.mode_call(torch, "cpu", True)
        self.assertEqual(r["calls"], [2, 6])
        self.assertEqual(len(r["plain_ms"]), 2)
        self.assertEqual(len(r["moded_ms"]), 2)
        self.assertTrue(all(t > 0 for t in r["plain_ms"] + r["moded_ms"]))

    @unittest.skipUnless(os.environ.get("LOWBIT_PLAN"), "set LOWBIT_PLAN to a lowbit-plan binary")
    def test_lowbit_plan_takes_the_probe_json(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "probe.json")
            self.assertEqual(sp.main(["--smoke", "--out", path]), 0)
            r = subprocess.run([os.environ["LOWBIT_PLAN"], "--model", "bert-base", "--cluster",
                                "H200", "--switch-costs", path], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main()
