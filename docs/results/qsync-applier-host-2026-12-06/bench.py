# Host time a step under each plan of a 12-block ViT (hidden 32) on the CPU: what the applier adds.
import sys, time, statistics, torch, torch.nn.functional as F, torchvision
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "examples/pytorch")
from qsync import export as ex, qsync_model as qm
from qsync.apply_plan import applied_plan
torch.manual_seed(0); torch.set_num_threads(1)
vit = torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=12, num_heads=2,
                                          hidden_dim=32, mlp_dim=64, num_classes=10).train()
x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
fl = lambda: F.cross_entropy(vit(x).float(), y)
mj = qm.model_json(ex.record_ops(vit, fl, "fp32", device_type="cpu"), "vit")
plans = qm.mixed_plans(mj)
uni = {p: {"default": p, "ops": {}} for p in ("fp32", "bf16")}
cases = [("bf16", uni["bf16"], False), ("bf16-wrapall", uni["bf16"], True), ("fp32", uni["fp32"], False)]
cases += [(k, v, False) for k, v in plans.items()]
def run(pl, wa, n=30):
    with applied_plan(vit, pl, mj, device_type="cpu", wrap_all=wa) as ap:
        ts = []
        for i in range(n + 5):
            t0 = time.perf_counter()
            with ap.step_context(): loss = fl()
            t1 = time.perf_counter()
            loss.backward(); vit.zero_grad(set_to_none=True)
            if i >= 5: ts.append((t1 - t0) * 1e3)
        return statistics.median(ts), ap.summary()
# Rounds of every case in turn: the development machine's CPU is shared, so each case's
# figure is the median of its rounds' medians.
import collections
seen, summary = collections.defaultdict(list), {}
for r in range(5):
    for name, pl, wa in cases:
        t, s = run(pl, wa)
        seen[name].append(t)
        summary[name] = s
for name in seen:
    print("%-14s fwd %.2f ms  (%s; rounds %s)" % (name, statistics.median(seen[name]), summary[name],
                                                " ".join("%.2f" % t for t in seen[name])))
