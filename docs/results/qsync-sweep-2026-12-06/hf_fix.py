import sys, time, torch
import transformers as T
ROOT = __import__("os").path.abspath(__file__ + "/../../../..")  # the repository
sys.path.insert(0, ROOT + "/examples/pytorch")
from qsync.model_check import check_model
g = torch.Generator().manual_seed(1)
ids = torch.randint(2, 100, (2, 16), generator=g)
def causal(cfg_cls, **kw):
    m = T.AutoModelForCausalLM.from_config(getattr(T, cfg_cls)(**kw))
    return m, lambda: m(input_ids=ids, labels=ids).loss
def seq2seq(cfg_cls, **kw):
    m = T.AutoModelForSeq2SeqLM.from_config(getattr(T, cfg_cls)(**kw))
    return m, lambda: m(input_ids=ids, labels=torch.roll(ids, 1, 1)).loss
def classify(cfg_cls, **kw):
    m = T.AutoModelForSequenceClassification.from_config(getattr(T, cfg_cls)(num_labels=2, **kw))
    y = torch.randint(0, 2, (2,), generator=g)
    return m, lambda: m(input_ids=ids, labels=y).loss
cases = {
 "t5": lambda: seq2seq("T5Config", vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, decoder_start_token_id=0, pad_token_id=0),
 "gptj": lambda: causal("GPTJConfig", vocab_size=128, n_embd=32, n_layer=2, n_head=4, rotary_dim=8, n_positions=64),
 "codegen": lambda: causal("CodeGenConfig", vocab_size=128, n_embd=32, n_layer=2, n_head=4, rotary_dim=8, n_positions=64, n_ctx=64),
 "gpt_neo": lambda: causal("GPTNeoConfig", vocab_size=128, hidden_size=32, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=8, max_position_embeddings=64),
 "qwen3_moe": lambda: causal("Qwen3MoeConfig", vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2, max_position_embeddings=64),
 "deepseek_v3": lambda: causal("DeepseekV3Config", vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, first_k_dense_replace=1, max_position_embeddings=64),
 "xlnet": lambda: classify("XLNetConfig", vocab_size=128, d_model=32, n_layer=2, n_head=4, d_inner=64),
 "funnel": lambda: classify("FunnelConfig", vocab_size=128, d_model=32, n_head=4, d_head=8, d_inner=64, block_sizes=[1, 1]),
 "prophetnet": lambda: seq2seq("ProphetNetConfig", vocab_size=128, hidden_size=32, encoder_ffn_dim=64, decoder_ffn_dim=64, num_encoder_layers=2, num_decoder_layers=2, num_encoder_attention_heads=4, num_decoder_attention_heads=4, ngram=2, decoder_start_token_id=0, pad_token_id=0),
 "reformer": lambda: causal("ReformerConfig", vocab_size=128, hidden_size=32, attention_head_size=8, num_attention_heads=4, feed_forward_size=64, attn_layers=["local", "lsh"], axial_pos_shape=[4, 4], axial_pos_embds_dim=[16, 16], is_decoder=True, max_position_embeddings=16, local_attn_chunk_length=4, lsh_attn_chunk_length=4, num_buckets=2, num_hashes=1),
 "mamba2": lambda: causal("Mamba2Config", vocab_size=128, hidden_size=32, num_hidden_layers=2, num_heads=8, head_dim=8, expand=2, n_groups=1, state_size=16, chunk_size=8),
}
for name in (sys.argv[1:] or cases):
    t = time.time()
    try:
        torch.manual_seed(0)
        model, step = cases[name]()
        model.train()
        check_model(model, step, name)
        print("OK  %-14s %.1fs" % (name, time.time() - t), flush=True)
    except Exception as e:
        # is it the model (plain fp32 / autocast) or qsync?
        plain = []
        for ac in (False, True):
            try:
                torch.manual_seed(0); m2, s2 = cases[name](); m2.train()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=ac):
                    l = s2()
                l.backward(); plain.append("ok")
            except Exception as e2:
                plain.append("%s" % str(e2)[:80])
        print("ERR %-14s %.1fs %s: %s | plain fp32: %s | plain autocast: %s" % (name, time.time() - t, type(e).__name__, str(e)[:250].replace("\n", " "), plain[0], plain[1]), flush=True)
