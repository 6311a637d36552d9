# The applier's own forward casts (apply_plan._cast_one calls that change a dtype) against
# the edge casts lowbit-plan's replay prices in forward, per zoo model (full size, batch 1,
# 8 tokens; CPU) and mixed plan. Run from the repository root with a lowbit-plan binary at
# .gpubin/lowbit-plan (any build of tools/lowbit-plan).
import sys, os, csv, subprocess, tempfile
sys.path.insert(0, "examples/pytorch")
import torch
from qsync import zoo, export as ex, qsync_model as qm
from qsync import apply_plan as AP
tmp = tempfile.mkdtemp()
orig = AP._cast_one
log = []
def logged(t, dtype):
    y = orig(t, dtype)
    if y is not t: log.append((tuple(t.shape), t.dtype, dtype))
    return y
AP._cast_one = logged
sw = os.path.join(tmp, "sw.json")
open(sw, "w").write('{"device": {"cast_host_ms": 0.001, "cast_backward_host_ms": 0.002, "wrap_host_ms": 0.0}}')
for name in zoo.available()[0]:
    model, fl = zoo.make(name, 1, device="cpu", seq=8)
    mj = qm.model_json(ex.record_ops(model, fl, "fp32", device_type="cpu"), name)
    mpath = qm.write_json(os.path.join(tmp, "m.json"), mj)
    for pn, pl in qm.mixed_plans(mj).items():
        log.clear()
        with AP.applied_plan(model, pl, mj, device_type="cpu") as ap:
            with ap.step_context(): loss = fl()
            loss.backward(); model.zero_grad(set_to_none=True)
        n_app = len(log); el_app = sum(torch.Size(s).numel() for s, _, _ in log)
        ppath = qm.write_json(os.path.join(tmp, "p.json"), pl)
        tl = os.path.join(tmp, "tl.csv")
        subprocess.run([".gpubin/lowbit-plan", "--model", mpath, "--cluster", "H200", "--plan", ppath,
                        "--timeline", tl, "--switch-costs", sw], check=True, capture_output=True)
        fwd = [r for r in csv.DictReader(open(tl)) if r["kind"] == "cast" and abs(float(r["cpu_ms"]) - 0.001) < 1e-9]
        print("%-20s %-12s wrapped %3d | applier casts %3d | replay forward edge casts %3d" % (name, pn, len(ap.wrapped), n_app, len(fwd)), flush=True)
