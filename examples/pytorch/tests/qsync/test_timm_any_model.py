"""export and apply_plan on architectures the planner was not built around: timm models of
every family that timm has (residual, depthwise and re-parameterised CNNs, ConvNeXt,
ViTs with and without class tokens, windowed, pooling, mixer, hybrid and cross-scale
transformers, an LSTM-mixing sequencer, nested, hierarchical-masked, halo-attention,
outlooker and rotary ViTs), built without weights at their default input size, batch 2, on
the CPU.
For each, qsync.model_check.check_model: every parameter counted once, a uniform plan
wrapping nothing, a mixed plan (two parameter ops kept at fp32 in a bf16 step) training a
step with finite gradients, and where fp8 GEMMs run here, a plan whose default is fp8 too: on a GPU where there is one (its token
counts, e.g. 2 x 197, are no multiple of 16: the GEMMs' padding is exercised), else on
the CPU (a CPU without native fp8 runs _scaled_mm's reference code, minutes per model).
Needs torch and timm (skipped otherwise)."""

import unittest

try:
    import torch
    import torch.nn.functional as F
    import timm
except ImportError:
    torch = timm = None

MODELS = ("resnet18", "efficientnet_b0", "regnetx_002", "convnext_atto", "deit_tiny_patch16_224",
          "swin_tiny_patch4_window7_224", "mixer_s32_224", "poolformer_s12", "levit_128s",
          "coat_lite_tiny", "mobilevit_xxs", "ghostnet_050", "densenet121", "inception_v3",
          "nfnet_f0", "cait_xxs24_224", "crossvit_tiny_240", "maxvit_nano_rw_256",
          "edgenext_xx_small", "efficientformer_l1", "eva02_tiny_patch14_224", "fastvit_t8",
          "repvgg_a0", "hrnet_w18_small", "xcit_nano_12_p16_224", "pit_ti_224",
          "visformer_tiny", "twins_svt_small", "gcvit_xxtiny", "sequencer2d_s",
          "tnt_s_patch16_224", "hiera_tiny_224", "halonet26t", "volo_d1_224",
          "vit_small_patch16_rope_224")


@unittest.skipIf(timm is None, "needs torch and timm")
class AnyTimmModel(unittest.TestCase):
    def test_every_family_exports_and_runs_a_mixed_plan(self):
        from qsync import fp8
        from qsync.model_check import check_model

        fp8_device = fp8.first_device()  # the GPU where there is one
        for name in MODELS:
            with self.subTest(model=name):
                torch.manual_seed(0)
                try:
                    m = timm.create_model(name, pretrained=False, num_classes=10)
                except RuntimeError as e:  # a model this timm does not have
                    self.skipTest(f"{name}: {e}")
                m.train()
                side = m.default_cfg["input_size"][-1]
                x, y = torch.randn(2, 3, side, side), torch.randint(0, 10, (2,))

                def step():
                    dev = next(m.parameters()).device  # the fp8 plan runs where fp8 does
                    return F.cross_entropy(m(x.to(dev)).float(), y.to(dev))

                check_model(m, step, name, fp8_device=fp8_device)


if __name__ == "__main__":
    unittest.main()
