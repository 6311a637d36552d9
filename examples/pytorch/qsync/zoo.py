"""A validation zoo: models from torchvision, timm and transformers that nobody here
wrote, built from code (no weights, no downloads), each with a training step at two
batch sizes.

``CASES`` lists them: residual CNNs, depthwise/mobile CNNs, ConvNeXt-style CNNs, ViTs,
a windowed-attention transformer, decoder LMs (GPT-2-style; Llama and Qwen2: RMSNorm
and rotary embeddings), an encoder (BERT) and encoder-decoders (T5, BART). Each case
has two batch sizes: ``gpu`` (meant to keep one H200 busy: large enough that kernel
time dominates the step) and ``host`` (batch 1: small kernels, the step closer to
host-bound). Which regime a step is really in is for the measurement to say; nothing
here was timed.

``make(name, batch, tiny=False, device="cpu")`` gives ``(model, forward_loss)``:
``forward_loss()`` runs the forward on a fixed batch and returns the loss, as
``export.record_ops`` and ``validate`` take it. ``tiny=True`` builds the same classes
at a toy size (a few layers, narrow, 32x32 images or 16 tokens) for CPU tests; the
library's code paths (attention implementation, norms, in-place ops, tied weights,
ModelOutput returns) are the same.

Needs torch and, per case, its library (``library`` says which); ``available()``
lists the cases whose library imports. Written against torch 2.11-2.15, torchvision
0.26-0.29, transformers 5.x and timm 1.0.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

IMAGE = 224  # full-size vision input
TINY_IMAGE = 64  # the smallest a /32 CNN keeps 2x2 at: batch norm in training needs > 1 value a channel at batch 1
TINY_SEQ = 16


@dataclass
class Case:
    """One zoo model: its library, family, builder (``build(tiny)`` -> module; the
    transformers and timm ViT builders also take keyword overrides of the full size's
    config, which fp8_quality uses for wider variants of the same architectures) and
    inputs (``kind``: "image" or the causal/encoder/seq2seq LM kinds), and its two
    batch sizes and sequence lengths (``gpu``: kernel-bound; ``host``: batch 1)."""

    name: str
    library: str
    family: str
    build: Callable[[bool], object]
    kind: str = "image"
    batches: Dict[str, int] = field(default_factory=lambda: {"gpu": 128, "host": 1})
    seq: Dict[str, int] = field(default_factory=lambda: {"gpu": 512, "host": 128})
    classes: int = 1000
    vocab: int = 0  # token models: the vocabulary (the tiny configs use TINY_VOCAB)


TINY_VOCAB = 128


# ------------------------------------------------------------------- torchvision

def _tv_resnet(tiny):
    from torchvision.models import resnet

    if tiny:  # Bottleneck blocks (the in-place residual add and ReLU), one per stage
        return resnet.ResNet(resnet.Bottleneck, [1, 1, 1, 1], num_classes=10, width_per_group=16)
    return resnet.resnet50(weights=None)


def _tv_mobilenet(tiny):
    from torchvision.models import mobilenetv3 as mv

    if tiny:  # three inverted residuals: depthwise convs, squeeze-excitation, hardswish
        cfg = [mv.InvertedResidualConfig(16, 3, 16, 16, True, "RE", 2, 1, 1.0),
               mv.InvertedResidualConfig(16, 3, 32, 24, False, "HS", 2, 1, 1.0),
               mv.InvertedResidualConfig(24, 5, 48, 24, True, "HS", 1, 1, 1.0)]
        return mv.MobileNetV3(cfg, last_channel=64, num_classes=10)
    return mv.mobilenet_v3_large(weights=None)


def _tv_efficientnet(tiny):
    from torchvision.models import efficientnet as en

    if tiny:  # MBConv blocks with stochastic depth, two stages
        cfg = [en.MBConvConfig(1, 3, 1, 16, 8, 1), en.MBConvConfig(6, 3, 2, 8, 16, 2)]
        return en.EfficientNet(cfg, dropout=0.2, num_classes=10)
    return en.efficientnet_b0(weights=None)


def _tv_convnext(tiny):
    from torchvision.models import convnext

    if tiny:  # CNBlocks keep their layer scale as a parameter of a non-leaf module
        return convnext.ConvNeXt([convnext.CNBlockConfig(16, 32, 1),
                                  convnext.CNBlockConfig(32, None, 1)], num_classes=10)
    return convnext.convnext_tiny(weights=None)


def _tv_vit(tiny):
    from torchvision.models import vision_transformer as vt

    if tiny:  # nn.MultiheadAttention (fused in-projection), class token, position embedding
        return vt.VisionTransformer(image_size=TINY_IMAGE, patch_size=8, num_layers=2,
                                    num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10)
    return vt.vit_b_16(weights=None)


def _tv_swin(tiny):
    from torchvision.models import swin_transformer as st

    if tiny:  # shifted windows: qkv and proj Linears used through F.linear
        return st.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2],
                                  num_heads=[1, 2], window_size=[4, 4], num_classes=10)
    return st.swin_t(weights=None)


# -------------------------------------------------------------------------- timm

def _timm_vit(tiny, model="vit_small_patch16_224", **overrides):
    import timm

    if tiny:
        return timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=10,
                                 img_size=TINY_IMAGE, patch_size=8, depth=2, embed_dim=32,
                                 num_heads=2)
    return timm.create_model(model, pretrained=False, **overrides)


def _timm_mobilenet(tiny):
    import timm

    # BatchNormAct2d: a batch norm with children (its activation), F.batch_norm on its
    # own weight.
    return timm.create_model("mobilenetv3_small_050" if tiny else "mobilenetv3_large_100",
                             pretrained=False, num_classes=10 if tiny else 1000)


def _timm_convnext(tiny):
    import timm

    if tiny:
        return timm.create_model("convnext_atto", pretrained=False, num_classes=10,
                                 depths=(1, 1, 1, 1), dims=(16, 16, 32, 32))
    return timm.create_model("convnext_nano", pretrained=False)


# ------------------------------------------------------------------ transformers

def _hf(config_name, model_name, full, tiny_kw):
    def build(tiny, **overrides):
        import transformers

        kw = dict(full, **overrides)
        if tiny:
            kw = dict(tiny_kw, vocab_size=TINY_VOCAB)
        config = getattr(transformers, config_name)(**kw)
        return getattr(transformers, model_name)(config)
    return build


_GPT2 = _hf("GPT2Config", "GPT2LMHeadModel",
            dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257),
            dict(n_layer=2, n_embd=32, n_head=2, n_positions=64, bos_token_id=0,
                 eos_token_id=0))
_LLAMA = _hf("LlamaConfig", "LlamaForCausalLM",
             dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                  num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                  max_position_embeddings=2048, tie_word_embeddings=False),
             dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
_QWEN2 = _hf("Qwen2Config", "Qwen2ForCausalLM",
             dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=8,
                  num_attention_heads=14, num_key_value_heads=2, vocab_size=32000,
                  max_position_embeddings=2048, tie_word_embeddings=True),
             dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  tie_word_embeddings=True))
_BERT = _hf("BertConfig", "BertForSequenceClassification",
            dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, vocab_size=30522, num_labels=2),
            dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=64, num_labels=2))
_T5 = _hf("T5Config", "T5ForConditionalGeneration",
          dict(d_model=512, d_ff=2048, d_kv=64, num_layers=6, num_heads=8, vocab_size=32128,
               decoder_start_token_id=0, pad_token_id=0, eos_token_id=1),
          dict(d_model=32, d_ff=64, d_kv=16, num_layers=2, num_heads=2,
               decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
_BART = _hf("BartConfig", "BartForConditionalGeneration",
            dict(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                 decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
                 vocab_size=50265, max_position_embeddings=1024),
            dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                 max_position_embeddings=64))

_LM_BATCH = {"gpu": 8, "host": 1}
_CNN_BATCH = {"gpu": 128, "host": 1}
_VIT_BATCH = {"gpu": 64, "host": 1}

CASES: Dict[str, Case] = {c.name: c for c in [
    Case("tv-resnet50", "torchvision", "residual CNN", _tv_resnet, batches=_CNN_BATCH),
    Case("tv-mobilenet-v3", "torchvision", "depthwise CNN", _tv_mobilenet, batches=_CNN_BATCH),
    Case("tv-efficientnet-b0", "torchvision", "depthwise CNN", _tv_efficientnet,
         batches=_CNN_BATCH),
    Case("tv-convnext-tiny", "torchvision", "ConvNeXt", _tv_convnext, batches=_VIT_BATCH),
    Case("tv-vit-b16", "torchvision", "ViT", _tv_vit, batches=_VIT_BATCH),
    Case("tv-swin-t", "torchvision", "windowed attention", _tv_swin, batches=_VIT_BATCH),
    Case("timm-vit-small", "timm", "ViT", _timm_vit, batches=_VIT_BATCH),
    Case("timm-mobilenetv3", "timm", "depthwise CNN", _timm_mobilenet, batches=_CNN_BATCH),
    Case("timm-convnext-nano", "timm", "ConvNeXt", _timm_convnext, batches=_VIT_BATCH),
    Case("hf-gpt2", "transformers", "decoder LM", _GPT2, kind="causal", batches=_LM_BATCH,
         vocab=50257),
    Case("hf-llama", "transformers", "decoder LM (RMSNorm, rotary)", _LLAMA, kind="causal",
         batches=_LM_BATCH, vocab=32000),
    Case("hf-qwen2", "transformers", "decoder LM (RMSNorm, rotary, tied)", _QWEN2,
         kind="causal", batches=_LM_BATCH, vocab=32000),
    Case("hf-bert", "transformers", "encoder", _BERT, kind="classify",
         batches={"gpu": 32, "host": 1}, vocab=30522),
    Case("hf-t5", "transformers", "encoder-decoder", _T5, kind="seq2seq",
         batches={"gpu": 16, "host": 1}, vocab=32128),
    Case("hf-bart", "transformers", "encoder-decoder", _BART, kind="seq2seq",
         batches={"gpu": 16, "host": 1}, vocab=50265),
]}


def available() -> Tuple[List[str], Dict[str, str]]:
    """(case names whose library imports here, {missing library: reason})."""
    ok, missing = [], {}
    for lib in sorted({c.library for c in CASES.values()} | {"torch"}):
        try:
            importlib.import_module(lib)
        except Exception as e:  # noqa: BLE001 (ImportError, or a broken install)
            missing[lib] = "%s: %s" % (type(e).__name__, e)
    if "torch" not in missing:
        ok = [n for n, c in CASES.items() if c.library not in missing]
    return ok, missing


def make(name: str, batch: int, tiny: bool = False, device: str = "cpu", seq: int = 0):
    """(model in training mode on `device`, forward_loss) for zoo case `name` at
    `batch` (a number, or "gpu"/"host" for the case's own), `seq` tokens for the token
    models (0: the case's, by the batch's regime; TINY_SEQ when tiny)."""
    import torch
    import torch.nn.functional as F

    case = CASES[name]
    regime = batch if isinstance(batch, str) else ("host" if batch == 1 else "gpu")
    b = case.batches[batch] if isinstance(batch, str) else int(batch)
    torch.manual_seed(0)
    model = case.build(tiny).to(device)
    model.train()
    gen = torch.Generator().manual_seed(1)
    if case.kind == "image":
        side = TINY_IMAGE if tiny else IMAGE
        classes = 10 if tiny else case.classes
        x = torch.randn(b, 3, side, side, generator=gen).to(device)
        y = torch.randint(0, classes, (b,), generator=gen).to(device)

        def forward_loss():
            return F.cross_entropy(model(x), y)
        return model, forward_loss
    s = seq or (TINY_SEQ if tiny else case.seq[regime])
    vocab = TINY_VOCAB if tiny else case.vocab
    ids = torch.randint(0, vocab, (b, s), generator=gen).to(device)
    if case.kind == "causal":
        def forward_loss():
            return model(input_ids=ids, labels=ids).loss  # a ModelOutput
    elif case.kind == "classify":
        labels = torch.randint(0, 2, (b,), generator=gen).to(device)

        def forward_loss():
            return model(input_ids=ids, labels=labels).loss
    else:  # seq2seq: the decoder's labels are the source shifted by one
        labels = torch.roll(ids, 1, dims=1)

        def forward_loss():
            return model(input_ids=ids, labels=labels).loss
    return model, forward_loss
