"""sweep.py's merge of the runs' CSVs (no torch needed)."""

import unittest

from sweep import merge


class MergeTest(unittest.TestCase):
    @staticmethod
    def row(config, seed, step, val, ranks=2):
        return {"config": config, "seed": str(seed), "ranks": str(ranks), "step": str(step),
                "train_loss": "1.00000", "val_loss": val, "seconds": "1.0"}

    def test_rows_are_ordered_and_deduplicated(self):
        old = [self.row("bf16", 1, 250, "2.0"), self.row("bf16", 0, 250, "2.1")]
        new = [self.row("b4", 0, 500, "1.5"), self.row("bf16", 0, 500, "1.4"),
               self.row("b4", 0, 250, "2.2"), self.row("bf16", 0, 250, "2.1")]
        got = [(r["config"], r["step"], r["seed"]) for r in merge([old, new])]
        self.assertEqual(got, [("bf16", "250", "0"), ("bf16", "250", "1"), ("bf16", "500", "0"),
                               ("b4", "250", "0"), ("b4", "500", "0")])

    def test_a_disagreeing_rerun_is_refused(self):
        with self.assertRaisesRegex(ValueError, r"\('bf16', 2, 0, 250\): 2.1 vs 2.2"):
            merge([[self.row("bf16", 0, 250, "2.1")], [self.row("bf16", 0, 250, "2.2")]])
