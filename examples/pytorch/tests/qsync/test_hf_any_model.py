"""export and apply_plan on transformers architectures the planner was not built around:
decoder LMs (learned, rotary and ALiBi positions, parallel blocks, mixture-of-experts
routers, state-space and RWKV blocks), encoders (relative and disentangled attention,
sparse and local attention, convolutions), encoder-decoders, vision models (ViT, BEiT,
Swin, ConvNeXt, ResNet, SegFormer, DINOv2), speech (Whisper, wav2vec 2.0), CLIP's two
towers, and a classifier whose encoder is frozen. Each is built from its config at a toy
size (two layers, 32 wide), without weights, batch 2, on the CPU.

For each, qsync.model_check.check_model: every parameter counted once, by an op or as
unused (a branch the step does not take), those without requires_grad as frozen; a
uniform bf16 plan wrapping nothing; a mixed plan (two parameter ops kept at fp32 in a bf16
step) training a step with finite gradients. With transformers' activation checkpointing,
a mixed plan's gradients equal those without it. Needs torch and transformers (skipped
otherwise)."""

import unittest

try:
    import torch
    import transformers as T
except ImportError:
    torch = T = None

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             vocab_size=128, max_position_embeddings=64, num_key_value_heads=2)
# The names some configs use for the same sizes, set where the config has them.
ALIASES = dict(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_decoder_layers=2, num_heads=4,
               encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, n_layer=2,
               n_embd=32, n_head=4, n_positions=64, embedding_size=32, head_dim=8,
               num_experts=4, num_local_experts=4, n_routed_experts=4, moe_intermediate_size=32,
               pad_token_id=0, decoder_start_token_id=0, bos_token_id=0, eos_token_id=1,
               num_labels=2, attention_window=4, block_size=4)

CAUSAL = ("gpt2", "opt", "gpt_neox", "mistral", "mixtral", "phi", "phi3", "falcon", "gemma",
          "gemma2", "stablelm", "bloom", "qwen2", "qwen2_moe", "olmo", "starcoder2", "xglm",
          "biogpt", "mpt", "gpt_bigcode", "cohere", "qwen3", "mamba", "rwkv")
CLASSIFY = ("bert", "roberta", "distilbert", "albert", "electra", "deberta-v2", "mpnet",
            "convbert", "squeezebert", "longformer", "big_bird", "modernbert", "roformer")
SEQ2SEQ = ("mt5", "bart", "mbart", "pegasus", "marian", "led", "umt5", "m2m_100")


AUTO = {"causal": "AutoModelForCausalLM", "classify": "AutoModelForSequenceClassification",
        "seq2seq": "AutoModelForSeq2SeqLM"}


def _text_step(model, kind):
    """The model with a step on a fixed batch of token ids: next tokens, a class, or the
    ids shifted by one as the target sequence."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 100, (2, 16), generator=g)
    labels = {"causal": ids, "classify": torch.randint(0, 2, (2,), generator=g),
              "seq2seq": torch.roll(ids, 1, 1)}[kind]
    return model, lambda: model(input_ids=ids, labels=labels).loss


def _text_model(model_type, kind):
    config = T.AutoConfig.for_model(model_type, **SMALL)
    for k, v in list(ALIASES.items()) + list(SMALL.items()):
        if hasattr(config, k):
            try:
                setattr(config, k, v)
            except AttributeError:  # a property derived from the others (Falcon's head_dim)
                pass
    return _text_step(getattr(T, AUTO[kind]).from_config(config), kind)


def _image(config_class, model_class, side=32, **kw):
    def build():
        model = getattr(T, model_class)(getattr(T, config_class)(num_labels=3, image_size=side,
                                                                 **kw))
        x, y = torch.randn(2, 3, side, side), torch.randint(0, 3, (2,))
        return model, lambda: model(pixel_values=x, labels=y).loss
    return build


def _whisper():
    c = T.WhisperConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                        vocab_size=128, num_mel_bins=16, max_source_positions=20,
                        max_target_positions=32, pad_token_id=0, decoder_start_token_id=1,
                        bos_token_id=1, eos_token_id=2)
    model = T.WhisperForConditionalGeneration(c)
    x, labels = torch.randn(2, 16, 40), torch.randint(3, 100, (2, 8))
    return model, lambda: model(input_features=x, labels=labels).loss


def _wav2vec2():
    small = {k: SMALL[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                   "intermediate_size")}
    c = T.Wav2Vec2Config(**small, conv_dim=(16, 16), conv_kernel=(10, 3), conv_stride=(5, 2),
                         num_feat_extract_layers=2, num_conv_pos_embeddings=16,
                         num_conv_pos_embedding_groups=4, num_labels=3)
    model = T.Wav2Vec2ForSequenceClassification(c)
    x, y = torch.randn(2, 800), torch.randint(0, 3, (2,))
    return model, lambda: model(input_values=x, labels=y).loss


def _clip():
    tower = {k: SMALL[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                   "intermediate_size")}
    c = T.CLIPConfig(text_config=dict(tower, vocab_size=128, max_position_embeddings=32),
                     vision_config=dict(tower, image_size=32, patch_size=8), projection_dim=16)
    model = T.CLIPModel(c)
    ids, x = torch.randint(0, 128, (2, 8)), torch.randn(2, 3, 32, 32)
    return model, lambda: model(input_ids=ids, pixel_values=x, return_loss=True).loss


def _frozen_bert():
    model, step = _text_model("bert", "classify")
    for p in model.bert.parameters():  # fine-tuning the head alone
        p.requires_grad_(False)
    return model, step


def _configured(config_class, kind, **kw):
    """A text model whose sizes need settings of their own (the generic ones above break
    it: rotary widths, expert counts, MLA ranks, block layouts)."""
    return lambda: _text_step(getattr(T, AUTO[kind]).from_config(getattr(T, config_class)(**kw)),
                              kind)


CONFIGURED = {
    # relative position buckets, tied input/output embeddings
    "t5": _configured("T5Config", "seq2seq", vocab_size=128, d_model=32, d_kv=8, d_ff=64,
                      num_layers=2, num_decoder_layers=2, num_heads=4, decoder_start_token_id=0,
                      pad_token_id=0),
    # partial rotary embedding
    "gptj": _configured("GPTJConfig", "causal", vocab_size=128, n_embd=32, n_layer=2,
                        n_head=4, rotary_dim=8, n_positions=64),
    # alternating global and local attention
    "gpt_neo": _configured("GPTNeoConfig", "causal", vocab_size=128, hidden_size=32,
                           num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
                           window_size=8, max_position_embeddings=64),
    # top-k routed experts
    "qwen3_moe": _configured("Qwen3MoeConfig", "causal", vocab_size=128, hidden_size=32,
                             intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                             num_experts=4, num_experts_per_tok=2, max_position_embeddings=64),
    # low-rank (MLA) attention, a dense first layer, grouped expert routing
    "deepseek_v3": _configured("DeepseekV3Config", "causal", vocab_size=128, hidden_size=32,
                               intermediate_size=64, moe_intermediate_size=32,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                               n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                               kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                               qk_nope_head_dim=8, v_head_dim=8, first_k_dense_replace=1,
                               max_position_embeddings=64),
    # two-stream relative attention
    "xlnet": _configured("XLNetConfig", "classify", num_labels=2, vocab_size=128,
                         d_model=32, n_layer=2, n_head=4, d_inner=64),
    # pooling between blocks
    "funnel": _configured("FunnelConfig", "classify", num_labels=2, vocab_size=128,
                          d_model=32, n_head=4, d_head=8, d_inner=64, block_sizes=[1, 1]),
    # n-gram streams in the decoder
    "prophetnet": _configured("ProphetNetConfig", "seq2seq", vocab_size=128, hidden_size=32,
                              encoder_ffn_dim=64, decoder_ffn_dim=64, num_encoder_layers=2,
                              num_decoder_layers=2, num_encoder_attention_heads=4,
                              num_decoder_attention_heads=4, ngram=2, decoder_start_token_id=0,
                              pad_token_id=0),
    # reversible layers: the backward recomputes each layer's forward itself
    "reformer": _configured("ReformerConfig", "causal", vocab_size=128, hidden_size=32,
                            attention_head_size=8, num_attention_heads=4, feed_forward_size=64,
                            attn_layers=["local", "lsh"], axial_pos_shape=[4, 4],
                            axial_pos_embds_dim=[16, 16], is_decoder=True,
                            max_position_embeddings=16, local_attn_chunk_length=4,
                            lsh_attn_chunk_length=4, num_buckets=2, num_hashes=1),
    # state-space blocks (the torch path: no fused kernel on the CPU)
    "mamba2": _configured("Mamba2Config", "causal", vocab_size=128, hidden_size=32,
                          num_hidden_layers=2, num_heads=8, head_dim=8, expand=2, n_groups=1,
                          state_size=16, chunk_size=8),
}

_VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            patch_size=8)
OTHERS = {
    "vit": _image("ViTConfig", "ViTForImageClassification", **_VIT),
    "beit": _image("BeitConfig", "BeitForImageClassification", **_VIT),
    "dinov2": _image("Dinov2Config", "Dinov2ForImageClassification", **_VIT),
    "swin": _image("SwinConfig", "SwinForImageClassification", patch_size=4, embed_dim=16,
                   depths=[1, 1], num_heads=[2, 2], window_size=4),
    "convnext": _image("ConvNextConfig", "ConvNextForImageClassification", hidden_sizes=[8, 16],
                       depths=[1, 1], num_stages=2),
    "resnet": _image("ResNetConfig", "ResNetForImageClassification", hidden_sizes=[8, 16],
                     depths=[1, 1], embedding_size=8),
    "segformer": _image("SegformerConfig", "SegformerForImageClassification",
                        hidden_sizes=[8, 16], depths=[1, 1], num_encoder_blocks=2,
                        sr_ratios=[2, 1], num_attention_heads=[1, 2], patch_sizes=[7, 3],
                        strides=[4, 2], mlp_ratios=[2, 2]),
    "whisper": _whisper, "wav2vec2": _wav2vec2, "clip": _clip, "frozen-bert": _frozen_bert,
}


@unittest.skipIf(torch is None, "needs torch and transformers")
class AnyTransformersModel(unittest.TestCase):
    def test_text_models(self):
        from qsync.model_check import check_model

        for kind, names in (("causal", CAUSAL), ("classify", CLASSIFY), ("seq2seq", SEQ2SEQ)):
            for name in names:
                with self.subTest(model=name):
                    torch.manual_seed(0)
                    model, step = _text_model(name, kind)
                    check_model(model.train(), step, name)

    def test_models_with_configurations_of_their_own(self):
        from qsync.model_check import check_model

        for name, build in CONFIGURED.items():
            with self.subTest(model=name):
                torch.manual_seed(0)
                model, step = build()
                check_model(model.train(), step, name)

    def test_vision_speech_and_two_towers(self):
        from qsync.model_check import check_model

        for name, build in OTHERS.items():
            with self.subTest(model=name):
                torch.manual_seed(0)
                model, step = build()
                mj = check_model(model.train(), step, name)
                if name == "frozen-bert":  # the encoder's weights take no gradient
                    encoder = sum(p.numel() for p in model.bert.parameters())
                    self.assertEqual(sum(o.get("frozen_numel", 0) for o in mj["ops"]), encoder)

    def test_activation_checkpointing_recomputes_at_the_plans_precisions(self):
        # transformers' gradient_checkpointing_enable (non-reentrant): a mixed plan's
        # gradients equal those of the same model without checkpointing, bit for bit
        from qsync import export as ex
        from qsync import qsync_model as qm
        from qsync.model_check import step_under_plan

        for name, kind in (("llama", "causal"), ("gpt2", "causal"), ("bert", "classify"),
                           ("bart", "seq2seq")):
            with self.subTest(model=name):
                grads = []
                for checkpointed in (False, True):
                    torch.manual_seed(0)
                    model, step = _text_model(name, kind)
                    model.train()
                    if checkpointed:
                        model.gradient_checkpointing_enable()
                    mj = qm.model_json(ex.record_ops(model, step, "fp32", device_type="cpu"),
                                       name)
                    params = [o["name"] for o in mj["ops"] if o["param_numel"] > 0]
                    plan = {"default": "bf16", "ops": {
                        op: "fp32" for op in (params[1], params[len(params) // 2], params[-2])}}
                    ap, _ = step_under_plan(model, plan, mj, step)
                    self.assertTrue(ap.wrapped)
                    grads.append({n: p.grad for n, p in model.named_parameters()
                                  if p.grad is not None})
                self.assertEqual(grads[0].keys(), grads[1].keys())
                for n in grads[0]:
                    self.assertTrue(torch.equal(grads[0][n], grads[1][n]), n)


if __name__ == "__main__":
    unittest.main()
