"""Per forward step of the zoo's models under the applier's mixed plans (CPU, full size,
batch 1, 8 tokens): the ops it wraps, the module hooks it installs and the calls they get,
and the torch calls its function mode dispatches (attribution._FunctionOps, on only while
a function op's caller runs). Run from the repository root with the CPU torch:

    python3 docs/results/qsync-zoo-2026-12-07-h100/applier_events.py > applier_events.txt
"""
import sys, os, collections, time
sys.path.insert(0, "examples/pytorch")
import torch
from qsync import zoo, export as ex, qsync_model as qm
from qsync import apply_plan as AP, attribution as at
calls = collections.Counter()
orig_tf = at._FunctionOps.__torch_function__
def counted_tf(self, func, types, args=(), kwargs=None):
    calls["mode"] += 1
    return orig_tf(self, func, types, args, kwargs)
at._FunctionOps.__torch_function__ = counted_tf
def wrap_hooks(model):
    n = 0
    for m in model.modules():
        for d in (m._forward_pre_hooks, m._forward_hooks):
            for k, f in list(d.items()):
                def c(*a, _f=f, **kw):
                    calls["hook"] += 1
                    return _f(*a, **kw)
                d[k] = c; n += 1
    return n
only = sys.argv[1:]
for name in zoo.available()[0]:
    if only and name not in only: continue
    model, fl = zoo.make(name, 1, device="cpu", seq=8)
    mj = qm.model_json(ex.record_ops(model, fl, "fp32", device_type="cpu"), name)
    fn_ops = sum(o.get("call") == "function" for o in mj["ops"])
    for pn, pl in qm.mixed_plans(mj).items():
        with AP.applied_plan(model, pl, mj, device_type="cpu") as ap:
            installed = wrap_hooks(model)
            calls.clear()
            with ap.step_context(): loss = fl()
            c = dict(calls)
            loss.backward(); model.zero_grad(set_to_none=True)
            wrapped_fn = sum(1 for o in ap.wrapped if any(x["name"] == o and x.get("call") == "function" for x in mj["ops"]))
            # what lowbit-plan prices of them: the export's count (mode_calls) of the
            # wrapped function ops (present from commit 109652d on; 0 before it)
            priced = sum(x.get("mode_calls", 0) for x in mj["ops"] if x["name"] in ap.wrapped)
        w = len(ap.wrapped)
        print("%-20s %-12s fn-ops %3d wrapped %3d (fn %2d) | hooks installed %4d, calls %4d (%.1f per wrapped) | mode dispatches %5d, export's mode_calls %5.0f" % (
            name, pn, fn_ops, w, wrapped_fn, installed, c.get("hook", 0), c.get("hook", 0) / max(1, w), c.get("mode", 0), priced), flush=True)
