# Where a wrapped plan's forward host goes on the GPU machine: per case, uniform bf16/fp16 and the
# mixed plans; forward host median (no profiler), then cProfile of the forward over steps.
import sys, os, time, statistics, cProfile, pstats, io, json, gc
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../examples/pytorch"))
import torch
from qsync import zoo, export as ex, qsync_model as qm
from qsync.apply_plan import applied_plan
out = sys.argv[1]; cases = sys.argv[2].split(","); DEV = os.environ.get("DEV", "cuda")
res = {}
for cname in cases:
    zname, b = cname.rsplit("-b", 1)
    model, fl = zoo.make(zname, int(b), device=DEV, tiny=DEV == "cpu")
    mj = qm.model_json(ex.record_ops(model, fl, "fp32", device_type=DEV), zname)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=DEV == "cuda")
    plans = {"bf16": qm.uniform_plan("bf16"), "fp16": qm.uniform_plan("fp16")}
    plans.update(qm.mixed_plans(mj))
    for pn, pl in plans.items():
        with applied_plan(model, pl, mj, device_type=DEV) as ap:
            def step(prof=None):
                opt.zero_grad(set_to_none=True)
                t0 = time.perf_counter()
                if prof: prof.enable()
                with ap.step_context():
                    loss = fl()
                if prof: prof.disable()
                t1 = time.perf_counter()
                loss.backward(); t2 = time.perf_counter(); opt.step(); (torch.cuda.synchronize() if DEV == "cuda" else None)
                return (t1 - t0) * 1e3, (t2 - t1) * 1e3
            for _ in range(3): step()
            gc.disable()
            ts = [step() for _ in range(12)]
            pr = cProfile.Profile()
            for _ in range(4): step(pr)
            gc.enable()
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
        fwd = statistics.median(t[0] for t in ts); bwd = statistics.median(t[1] for t in ts)
        res[cname + "/" + pn] = {"summary": ap.summary(), "fwd_ms": fwd, "bwd_ms": bwd}
        print("== %s %s: fwd %.2f ms bwd %.2f ms (%s)" % (cname, pn, fwd, bwd, ap.summary()), flush=True)
        open(os.path.join(out, "%s_%s.prof.txt" % (cname, pn)), "w").write(s.getvalue())
    del model, opt; gc.collect(); DEV == "cuda" and torch.cuda.empty_cache()
json.dump(res, open(os.path.join(out, "diag.json"), "w"), indent=1)
