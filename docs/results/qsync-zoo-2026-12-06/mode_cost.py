"""CPU (run from the repository root, PYTHONPATH=examples/pytorch):
host cost of apply_plan's function mode, resting in quiet modules or not.
Per zoo model (tiny build, batch 1): the mixed plans' step time (median of N) and the
number of torch calls the mode sees, with quiet_modules as built and with it empty."""
import sys, time, statistics, json
import torch
import qsync.apply_plan as apm
from qsync import attribution, zoo, export as ex, qsync_model as qm

N = int(sys.argv[2]) if len(sys.argv) > 2 else 30
names = sys.argv[1].split(",")
checked = attribution._FunctionOps.__torch_function__
count = [0]
def counting(mode, func, *a, **k):
    count[0] += 1
    return checked(mode, func, *a, **k)
attribution._FunctionOps.__torch_function__ = counting
torch.set_num_threads(1)
for name in names:
    model, step = zoo.make(name, 1, tiny=True, device="cpu")
    mj = qm.model_json(ex.record_ops(model, step, "fp32", device_type="cpu"), name)
    plans = qm.mixed_plans(mj)
    for pname, plan in plans.items():
        res = {}
        for way in ("quiet", "everywhere"):
            if way == "everywhere":
                apm.quiet_modules = lambda *a: set()
            else:
                apm.quiet_modules = attribution.quiet_modules
            ts = []
            with apm.applied_plan(model, plan, mj, device_type="cpu") as ap:
                for i in range(N + 3):
                    count[0] = 0
                    t0 = time.perf_counter()
                    with ap.step_context():
                        loss = step()
                    loss.backward()
                    ts.append((time.perf_counter() - t0) * 1e3)
                    model.zero_grad(set_to_none=True)
            res[way] = (statistics.median(ts[3:]), count[0])
        print("%s %s: step %.2f ms (mode calls %d) resting, %.2f ms (%d) everywhere" % (
            name, pname, res["quiet"][0], res["quiet"][1], res["everywhere"][0], res["everywhere"][1]), flush=True)
