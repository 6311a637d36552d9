import sys, time, traceback, torch, timm, torch.nn.functional as F
ROOT = __import__("os").path.abspath(__file__ + "/../../../..")  # the repository
sys.path.insert(0, ROOT + "/examples/pytorch")
from qsync.model_check import check_model
names = sys.argv[1:]
for name in names:
    t = time.time()
    try:
        torch.manual_seed(0)
        m = timm.create_model(name, pretrained=False, num_classes=10)
        m.train()
        cfg = m.pretrained_cfg if hasattr(m, "pretrained_cfg") else m.default_cfg
        side = min(cfg["input_size"][-1], 256)
        x, y = torch.randn(2, 3, side, side), torch.randint(0, 10, (2,))
        def step():
            dev = next(m.parameters()).device
            out = m(x.to(dev))
            return F.cross_entropy(out.float(), y.to(dev))
        check_model(m, step, name)
        print("OK  %-40s %.1fs" % (name, time.time() - t), flush=True)
    except Exception as e:
        print("ERR %-40s %.1fs %s: %s" % (name, time.time() - t, type(e).__name__, str(e)[:400].replace("\n", " ")), flush=True)
