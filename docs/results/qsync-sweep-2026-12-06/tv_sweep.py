import sys, time, torch, torchvision
import torch.nn.functional as F
ROOT = __import__("os").path.abspath(__file__ + "/../../../..")  # the repository
sys.path.insert(0, ROOT + "/examples/pytorch")
from qsync.model_check import check_model
from torchvision import models as M
def cls(fn, side=64, **kw):
    def b():
        m = fn(num_classes=10, **kw)
        x, y = torch.randn(2, 3, side, side), torch.randint(0, 10, (2,))
        def step():
            out = m(x)
            if isinstance(out, tuple) or hasattr(out, "logits"):
                out = out[0] if isinstance(out, tuple) else out.logits
            return F.cross_entropy(out.float(), y)
        return m, step
    return b
def seg(fn):
    def b():
        m = fn(num_classes=3, weights_backbone=None)
        x = torch.randn(2, 3, 64, 64); y = torch.randint(0, 3, (2, 64, 64))
        return m, lambda: F.cross_entropy(m(x)["out"].float(), y)
    return b
def det(fn, **kw):
    def b():
        m = fn(num_classes=3, weights_backbone=None, **kw)
        imgs = [torch.rand(3, 128, 128) for _ in range(2)]
        tg = [{"boxes": torch.tensor([[10., 10., 60., 60.]]), "labels": torch.tensor([1])} for _ in range(2)]
        if "keypoint" in fn.__name__:
            for t in tg: t["keypoints"] = torch.rand(1, 17, 3) * 50 + 10
        if "mask" in fn.__name__:
            for t in tg:
                mk = torch.zeros(1, 128, 128, dtype=torch.uint8); mk[:, 10:60, 10:60] = 1; t["masks"] = mk
        return m, lambda: sum(m(imgs, tg).values())
    return b
def video(fn, frames=8, side=64):
    def b():
        m = fn(num_classes=10)
        x, y = torch.randn(2, 3, frames, side, side), torch.randint(0, 10, (2,))
        return m, lambda: F.cross_entropy(m(x).float(), y)
    return b
cases = {
 "googlenet": cls(M.googlenet, side=96, aux_logits=False, init_weights=True),
 "inception_v3": cls(M.inception_v3, side=299, aux_logits=True, init_weights=True),
 "shufflenet_v2": cls(M.shufflenet_v2_x0_5),
 "squeezenet": cls(M.squeezenet1_1),
 "mnasnet": cls(M.mnasnet0_5),
 "regnet_y_400mf": cls(M.regnet_y_400mf),
 "vit_b_16": cls(M.vit_b_16, side=224),
 "swin_v2_t": cls(M.swin_v2_t),
 "maxvit_t": cls(M.maxvit_t, side=224),
 "convnext_tiny": cls(M.convnext_tiny),
 "efficientnet_v2_s": cls(M.efficientnet_v2_s),
 "deeplabv3_mobilenet": seg(M.segmentation.deeplabv3_mobilenet_v3_large),
 "fcn_resnet50": seg(M.segmentation.fcn_resnet50),
 "maskrcnn": det(M.detection.maskrcnn_resnet50_fpn),
 "keypointrcnn": det(M.detection.keypointrcnn_resnet50_fpn, num_keypoints=17),
 "retinanet": det(M.detection.retinanet_resnet50_fpn),
 "fcos": det(M.detection.fcos_resnet50_fpn),
 "mvit_v2_s": video(M.video.mvit_v2_s, frames=16, side=224),
 "s3d": video(M.video.s3d, frames=16, side=112),
 "swin3d_t": video(M.video.swin3d_t, frames=8, side=64),
}
torch.backends.mkldnn.enabled = False  # oneDNN's CPU bf16 3-D conv wgrad (see docs)
for name in (sys.argv[1:] or cases):
    t = time.time()
    try:
        torch.manual_seed(0)
        m, step = cases[name]()
        check_model(m.train(), step, name)
        print("OK  %-22s %.1fs" % (name, time.time() - t), flush=True)
    except Exception as e:
        print("ERR %-22s %.1fs %s: %s" % (name, time.time() - t, type(e).__name__, str(e)[:300].replace("\n", " ")), flush=True)
