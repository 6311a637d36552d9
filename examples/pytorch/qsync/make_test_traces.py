"""Writes the small real traces the C++ loader tests read (test/data/qsync_real_*):
a 3-layer MLP trained for a few steps on the CPU under the stock torch.profiler, with
per-op ranges (export.instrument) and without, plus its model JSON. On a machine with
CUDA, ``--cuda`` writes the same from the GPU (kernels, streams, the autograd thread).

    lowbit-qsync-make-test-traces --out test/data
"""

import argparse
import os
import tempfile

import torch

from . import export as ex
from . import qsync_model as qm


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cuda", action="store_true")
    ap.add_argument("--steps", type=int, default=2)
    a = ap.parse_args()
    dev = "cuda" if a.cuda else "cpu"
    tag = "cuda" if a.cuda else "cpu"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10)).to(dev)
    x, y = torch.randn(32, 64, device=dev), torch.randint(0, 10, (32,), device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sync = torch.cuda.synchronize if a.cuda else (lambda: None)

    def forward_loss():
        return torch.nn.functional.cross_entropy(model(x), y)

    def step():
        opt.zero_grad(set_to_none=True)
        forward_loss().backward()
        opt.step()
        sync()

    records = ex.record_ops(model, forward_loss, "fp32", with_stats=True, device_type=dev)
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "t.json")
        with ex.instrument(model):
            ex.profile(step, raw, steps=a.steps, warmup=1)
        trace = qm.read_json(raw)
        qm.gzip_file(raw, os.path.join(a.out, "qsync_real_%s_trace.json.gz" % tag))
        ex.profile(step, raw, steps=a.steps, warmup=1)
        qm.gzip_file(raw, os.path.join(a.out, "qsync_real_%s_plain.json.gz" % tag))
    m = qm.model_json(records, "mlp-%s" % tag, trace=trace, optimizer_bytes_per_param=0)
    qm.write_json(os.path.join(a.out, "qsync_real_%s_model.json" % tag), m)
    print("wrote qsync_real_%s_{trace,plain}.json.gz and _model.json (torch %s)" % (
        tag, torch.__version__))


if __name__ == "__main__":
    main()
