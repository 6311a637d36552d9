import torch, timm, torch.nn.functional as F
torch.backends.mkldnn.enabled = False
torch.manual_seed(0)
m = timm.create_model("lambda_resnet26t", pretrained=False, num_classes=10).train()
side = m.pretrained_cfg["input_size"][-1]
x, y = torch.randn(2, 3, side, side), torch.randint(0, 10, (2,))
for ac in (False, True):
    m.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=ac):
        out = m(x)
    loss = F.cross_entropy(out.float(), y)
    loss.backward()
    bad = [n for n, p in m.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    print("autocast", ac, "loss", loss.item(), "non-finite grads", len(bad), bad[:5])
