"""overlap_trace.py's reading of a profiler trace (no GPU, standard library only, so CI's
python3 runs it with unittest): lowbit's kernels told by name, the overlap measured against
other streams only, the caller's stream found, the SVG."""

import csv
import os
import tempfile
import unittest

import overlap_trace as ot


def _kernel(name, stream, ts, dur):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
            "args": {"stream": stream, "device": 0}}


EVENTS = [
    _kernel("sm90_xmma_gemm_bf16", 7, 0, 100),          # backward of the last layer
    _kernel("void lowbit::kernels::detail::encode_kernel<...>(...)", 21, 90, 30),  # all beside
    _kernel("sm90_xmma_gemm_bf16", 7, 100, 100),        # the next layer's backward
    _kernel("void lowbit::kernels::detail::decode_kernel<...>(...)", 21, 150, 80),  # 50 of 80
    _kernel("elementwise_kernel", 7, 260, 10),          # after: no overlap
    _kernel("void lowbit::transport::detail::ipc_transfer_kernel<256>(...)", 7, 300, 20),  # caller's
    _kernel("void at::native::reduce_kernel<128, 4, ...>(...)", 7, 400, 5),  # torch's, not lowbit's
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5},
]


class OverlapTrace(unittest.TestCase):
    def test_kernels_are_read_and_lowbits_told_by_name(self):
        rows = ot.kernels_of_trace(EVENTS)
        assert len(rows) == 7  # the CPU op is not a kernel
        assert [r["lowbit"] for r in rows] == [0, 1, 0, 1, 0, 1, 0]

    def test_overlap_counts_only_time_beside_other_streams(self):
        o = ot.overlap(ot.kernels_of_trace(EVENTS))
        assert o["lowbit_us"] == 30 + 80 + 20
        assert o["overlapped_us"] == 30 + 50  # the stream-7 lowbit kernel overlaps nothing
        assert o["caller_stream"] == 7
        assert o["on_caller"] == 1
        assert o["lowbit_streams"] == [7, 21]

    def test_the_svg_has_a_lane_per_stream_and_a_box_per_kernel(self):
        rows = ot.kernels_of_trace(EVENTS)
        text = ot.svg(rows)
        assert text.startswith("<svg") and text.rstrip().endswith("</svg>")
        assert text.count("<rect") == 1 + len(rows)  # the background and the kernels
        assert "stream 7" in text and "stream 21" in text
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        tmp = d.name
        path = os.path.join(tmp, "k.csv")
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=ot.FIELDS)
            w.writeheader()
            w.writerows(rows)
        assert ot.read_rows(path) == [dict(r, start_us=float(r["start_us"]),
                                           dur_us=float(r["dur_us"])) for r in rows]
        svg = os.path.join(tmp, "o.svg")
        assert ot.main(["draw", path, "--svg", svg]) == 0
        with open(svg) as f:
            assert f.read().startswith("<svg")


if __name__ == "__main__":
    unittest.main()
