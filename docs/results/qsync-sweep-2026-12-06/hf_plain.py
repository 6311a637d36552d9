import sys, torch
ROOT = __import__("os").path.abspath(__file__ + "/../../../..")  # the repository
sys.path.insert(0, ROOT + "/examples/pytorch")
sys.path.insert(0, ROOT + "/examples/pytorch/tests/qsync")
import test_hf_any_model as H
for spec in sys.argv[1:]:
    name, kind = spec.split(":")
    for ac in (False, True):
        try:
            torch.manual_seed(0)
            model, step = H._text_model(name, kind)
            model.train()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=ac):
                loss = step()
            loss.backward()
            print("plain %-16s autocast=%d OK loss %.3f" % (name, ac, loss.item()), flush=True)
        except Exception as e:
            print("plain %-16s autocast=%d ERR %s: %s" % (name, ac, type(e).__name__, str(e)[:160].replace("\n"," ")), flush=True)
