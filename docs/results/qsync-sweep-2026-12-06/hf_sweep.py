import sys, time, torch
ROOT = __import__("os").path.abspath(__file__ + "/../../../..")  # the repository
sys.path.insert(0, ROOT + "/examples/pytorch")
sys.path.insert(0, ROOT + "/examples/pytorch/tests/qsync")
import test_hf_any_model as H
from qsync.model_check import check_model
for spec in sys.argv[1:]:
    name, kind = spec.split(":")
    t = time.time()
    try:
        torch.manual_seed(0)
        model, step = H._text_model(name, kind)
        check_model(model.train(), step, name)
        print("OK  %-22s %.1fs" % (name, time.time() - t), flush=True)
    except Exception as e:
        print("ERR %-22s %.1fs %s: %s" % (name, time.time() - t, type(e).__name__, str(e)[:300].replace("\n", " ")), flush=True)
