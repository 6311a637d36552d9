"""CPU tests: every model of qsync.zoo (torchvision, timm, transformers), at its tiny
size, exported and run under a mixed plan: no crash, every parameter at one op, kinds
and FLOPs sane (FLOPs adding up to torch's FlopCounterMode), the code between the ops
named under "unattributed", every op with parameters timed forward and backward with
no overlapping ranges, and a forward and backward under mixed plans. A case whose
library is not installed skips, naming it. With LOWBIT_PLAN set to a built lowbit-plan,
each model JSON is also predicted by it (a uniform bf16 plan)."""

import os
import subprocess
import sys
import tempfile
import unittest

from qsync import qsync_model as qm
from qsync import zoo  # no torch needed to list the cases

try:
    import torch
except ImportError:
    torch = None

if torch is not None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_any_module import _export, check_export, run_mixed_plans
    AVAILABLE, MISSING = zoo.available()
else:
    AVAILABLE, MISSING = [], {"torch": "not installed"}


class Zoo(unittest.TestCase):
    def test_zoo_covers_the_families(self):
        self.assertGreaterEqual(len(zoo.CASES), 12)
        families = {c.family.split(" (")[0] for c in zoo.CASES.values()}
        for f in ("residual CNN", "depthwise CNN", "ConvNeXt", "ViT", "windowed attention",
                  "decoder LM", "encoder", "encoder-decoder"):
            self.assertIn(f, families)
        self.assertEqual({c.library for c in zoo.CASES.values()},
                         {"torchvision", "timm", "transformers"})
        for c in zoo.CASES.values():
            self.assertEqual(set(c.batches), {"gpu", "host"}, c.name)
            self.assertGreater(c.batches["gpu"], c.batches["host"], c.name)


def _case_test(name):
    def test(self):
        if torch is None:
            self.skipTest("needs torch")
        lib = zoo.CASES[name].library
        if name not in AVAILABLE:
            self.skipTest("%s is not installed (%s)" % (lib, MISSING.get(lib, "")))
        torch.manual_seed(0)
        with torch.random.fork_rng(devices=[]):
            model, step = zoo.make(name, 2, tiny=True)
            records, mj, trace = _export(model, step)
            check_export(self, model, step, records, mj, trace)
            run_mixed_plans(self, model, step, mj)
        binary = os.environ.get("LOWBIT_PLAN")
        if binary:
            with tempfile.TemporaryDirectory() as d:
                m = qm.write_json(os.path.join(d, "m.json"), mj)
                c = qm.write_json(os.path.join(d, "c.json"), qm.cluster_json())
                p = qm.write_json(os.path.join(d, "p.json"), qm.uniform_plan("bf16"))
                t = qm.write_json(os.path.join(d, "t.json"), trace)
                out = os.path.join(d, "pred.json")
                r = subprocess.run([binary, "--model", m, "--cluster", c, "--traces",
                                    "fp32=" + t, "--plan", p, "--json", out],
                                   capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr[-2000:])
                self.assertGreater(qm.read_json(out)["plans"][0]["iteration_ms"], 0)
    test.__doc__ = "zoo case %s (tiny): export, checks, mixed plans" % name
    return test


for _name in zoo.CASES:
    setattr(Zoo, "test_" + _name.replace("-", "_"), _case_test(_name))


if __name__ == "__main__":
    unittest.main()
