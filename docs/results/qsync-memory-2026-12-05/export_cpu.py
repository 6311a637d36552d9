import sys, json, os, torch
from qsync import export as ex, qsync_model as qm, zoo
name, batch = sys.argv[1], int(sys.argv[2])
out = "/tmp/memchk/%s-b%d.model.json" % (name, batch)
model, fl = zoo.make(name, batch, tiny=False, device="cpu")
records = ex.record_ops(model, fl, "fp32", with_stats=True, device_type="cpu")
for p in ("fp16", "bf16"):
    ex.merge_saved_bytes(records, ex.record_ops(model, fl, p, device_type="cpu"))
mj = qm.model_json(records, name)
qm.write_json(out, mj)
qm.write_json("/tmp/memchk/cluster.json", qm.cluster_json("H200", ("fp16", "bf16", "fp32")))
print("wrote", out, len(mj["ops"]))
