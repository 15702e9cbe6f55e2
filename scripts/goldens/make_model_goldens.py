#!/usr/bin/env python3
"""Parity goldens for axengine's model families, made by HF transformers + peft on CPU in fp32.

For each case, tests/data/models/<case>/ gets:
  config.json, model.safetensors      the model dir, as transformers save_pretrained writes it
  adapter/                            a peft LoRA adapter (A seeded, B set to random values so gradients
                                      reach every factor), as peft save_pretrained writes it
  golden.safetensors                  input_ids, labels, logits (with the adapter), loss, aux_loss (MoE),
                                      and grad.<peft key> for every LoRA factor

Run with the project venv:  /root/.cache/axengine/venv/bin/python scripts/goldens/make_model_goldens.py
Sizes are tiny and odd on purpose: head_dim != hidden/heads, one kv head, expert counts that are not a
power of two, top-1 and top-3 routing.
"""
import json
import os
import shutil
import sys

import torch
import transformers
import peft
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "models")

CASES = {
    # llama: GQA 4/2, head_dim 6 != 20/4, llama3 RoPE scaling, tied embeddings, attention and MLP bias.
    "llama": dict(
        cls="LlamaForCausalLM",
        cfg=dict(model_type="llama", vocab_size=61, hidden_size=20, intermediate_size=28, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=6, rms_norm_eps=1e-5,
                 rope_parameters=dict(rope_type="llama3", rope_theta=5000.0, factor=8.0, low_freq_factor=1.0,
                                      high_freq_factor=4.0, original_max_position_embeddings=8),
                 tie_word_embeddings=True, attention_bias=True, mlp_bias=True),
        targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    ),
    # qwen2: q/k/v bias (no o_proj bias), sliding window 3 (< the 7 tokens) from max_window_layers 1: layer 0
    # full, layers 1-2 sliding; head_dim 6 = hidden/heads (Qwen2 derives it), GQA 3/1.
    "qwen2": dict(
        cls="Qwen2ForCausalLM",
        cfg=dict(model_type="qwen2", vocab_size=59, hidden_size=18, intermediate_size=22, num_hidden_layers=3,
                 num_attention_heads=3, num_key_value_heads=1, rms_norm_eps=1e-6, use_sliding_window=True,
                 sliding_window=3, max_window_layers=1,
                 rope_parameters=dict(rope_type="default", rope_theta=1e6), tie_word_embeddings=True),
        targets=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"],
    ),
    # mistral: sliding window 4 on every layer, head_dim 8 != 24/4, GQA 4/2, untied.
    "mistral": dict(
        cls="MistralForCausalLM",
        cfg=dict(model_type="mistral", vocab_size=51, hidden_size=24, intermediate_size=26, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5, sliding_window=4,
                 rope_parameters=dict(rope_type="default", rope_theta=1e6), tie_word_embeddings=False),
        targets=["q_proj", "v_proj", "gate_proj", "down_proj"],
    ),
    # qwen3: q/k norm, kv_heads = 1, head_dim 10 != 24/3, untied.
    "qwen3": dict(
        cls="Qwen3ForCausalLM",
        cfg=dict(model_type="qwen3", vocab_size=53, hidden_size=24, intermediate_size=20, num_hidden_layers=2,
                 num_attention_heads=3, num_key_value_heads=1, head_dim=10, rms_norm_eps=1e-6,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0), tie_word_embeddings=False),
        targets=["q_proj", "v_proj", "o_proj", "down_proj"],
    ),
    # qwen3 with YaRN: 8 frequencies, a correction ramp over the first 5 (theta 100, original length 64), the
    # attention factor 0.1 ln 4 + 1 from the default mscale (q/k norm path: the norm_rope op).
    "qwen3_yarn": dict(
        cls="Qwen3ForCausalLM",
        cfg=dict(model_type="qwen3", vocab_size=37, hidden_size=16, intermediate_size=20, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-6,
                 max_position_embeddings=256,
                 rope_parameters=dict(rope_type="yarn", rope_theta=100.0, factor=4.0,
                                      original_max_position_embeddings=64), tie_word_embeddings=False),
        targets=["q_proj", "k_proj", "down_proj"],
    ),
    # llama with dynamic NTK RoPE: max_position_embeddings 5 < the 7 tokens, so the base grows for the batch.
    "llama_dynamic": dict(
        cls="LlamaForCausalLM",
        cfg=dict(model_type="llama", vocab_size=37, hidden_size=16, intermediate_size=20, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5,
                 max_position_embeddings=5, rope_parameters=dict(rope_type="dynamic", rope_theta=500.0, factor=3.0),
                 tie_word_embeddings=False),
        targets=["q_proj", "v_proj", "up_proj"],
    ),
    # qwen3_moe: 5 experts, top-3, norm_topk_prob, layer 1 dense (mlp_only_layers), aux loss in the loss.
    "qwen3_moe": dict(
        cls="Qwen3MoeForCausalLM",
        cfg=dict(model_type="qwen3_moe", vocab_size=47, hidden_size=16, intermediate_size=18,
                 moe_intermediate_size=6, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                 head_dim=8, num_experts=5, num_experts_per_tok=3, norm_topk_prob=True, decoder_sparse_step=1,
                 mlp_only_layers=[1], router_aux_loss_coef=0.05, output_router_logits=True,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0), tie_word_embeddings=False),
        targets=["q_proj", "k_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    ),
    # qwen3_moe top-1 with decoder_sparse_step 2 and norm_topk_prob off.
    "qwen3_moe_top1": dict(
        cls="Qwen3MoeForCausalLM",
        cfg=dict(model_type="qwen3_moe", vocab_size=41, hidden_size=12, intermediate_size=14,
                 moe_intermediate_size=10, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                 head_dim=4, num_experts=3, num_experts_per_tok=1, norm_topk_prob=False, decoder_sparse_step=2,
                 router_aux_loss_coef=0.001, output_router_logits=False,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0), tie_word_embeddings=False),
        targets=["v_proj", "down_proj"],
    ),
    # mixtral: 3 experts top-2, per-expert w1/w2/w3 checkpoint, GQA, sliding window 4 (< the 7 tokens).
    "mixtral": dict(
        cls="MixtralForCausalLM",
        cfg=dict(model_type="mixtral", vocab_size=43, hidden_size=16, intermediate_size=12, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, num_local_experts=3, num_experts_per_tok=2,
                 router_aux_loss_coef=0.02, output_router_logits=True, rms_norm_eps=1e-5,
                 rope_parameters=dict(rope_type="default", rope_theta=1e6), tie_word_embeddings=False,
                 sliding_window=4),
        targets=["q_proj", "o_proj", "w1", "w2", "w3"],
    ),
    # gemma3_text: (1 + w) sandwich norms, per-head q/k norms, softmax scale query_pre_attn_scalar^-0.5 (12, not
    # head_dim 6), embeddings times sqrt(20), layers sliding (window 3 < the 7 tokens, local RoPE theta 100) /
    # full (linear-scaled RoPE) / sliding, gelu_pytorch_tanh MLP, GQA 4/2, tied.
    "gemma3": dict(
        cls="Gemma3ForCausalLM",
        cfg=dict(model_type="gemma3_text", vocab_size=57, hidden_size=20, intermediate_size=26, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=6, rms_norm_eps=1e-6,
                 query_pre_attn_scalar=12, sliding_window=3,
                 layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                 rope_parameters=dict(full_attention=dict(rope_type="linear", rope_theta=10000.0, factor=2.0),
                                      sliding_attention=dict(rope_type="default", rope_theta=100.0)),
                 tie_word_embeddings=True),
        targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    ),
    # olmoe: q/k RMSNorm over all heads before the head split (k over 2·4 = kv_heads·head_dim), clip_qkv 1.1 (clamps
    # some of q, k and v), 5 experts top-2 without renormalising (norm_topk_prob false), attention biases, aux
    # loss in the loss.
    "olmoe": dict(
        cls="OlmoeForCausalLM",
        cfg=dict(model_type="olmoe", vocab_size=49, hidden_size=16, intermediate_size=6, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, num_experts=5,
                 num_experts_per_tok=2, norm_topk_prob=False, router_aux_loss_coef=0.05, output_router_logits=True,
                 clip_qkv=1.1, attention_bias=True,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0), tie_word_embeddings=False),
        targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    ),
    # gpt_oss: attention sinks (perturbed to matter), layer 0 sliding (window 3 < the 7 tokens) and layer 1 full,
    # YaRN with truncate off, biases on q/k/v/o, the router and both expert projections, 3 experts top-2 with
    # a softmax over the chosen logits, the clamped GLU with swiglu_limit 0.6 (the clamp is hit at init 0.2),
    # head_dim 8 != 16/4, aux loss in the loss. The experts' own LoRA is not covered (attention targets only).
    "gpt_oss": dict(
        cls="GptOssForCausalLM",
        cfg=dict(model_type="gpt_oss", vocab_size=45, hidden_size=16, intermediate_size=6, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=3,
                 num_experts_per_tok=2, router_aux_loss_coef=0.05, output_router_logits=True, rms_norm_eps=1e-5,
                 sliding_window=3, layer_types=["sliding_attention", "full_attention"], swiglu_limit=0.6,
                 max_position_embeddings=2048,
                 rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0,
                                      beta_slow=1.0, truncate=False, original_max_position_embeddings=64),
                 tie_word_embeddings=False, attention_bias=True),
        targets=["q_proj", "k_proj", "v_proj", "o_proj"],
    ),
    # gpt_oss with its experts stored as MXFP4 (`*_blocks` / `*_scales`, quant_method mxfp4), as the gpt-oss
    # checkpoints ship: random codes and E8M0 scales, the model's dense experts set to transformers' own
    # dequantisation of them (convert_moe_packed_tensors), and the saved dir checked to load back through
    # Mxfp4Config(dequantize=True) with identical logits. hidden and intermediate are multiples of 32 (a block).
    "gpt_oss_mxfp4": dict(
        cls="GptOssForCausalLM", mxfp4=True,
        cfg=dict(model_type="gpt_oss", vocab_size=45, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=1, head_dim=8, num_local_experts=3,
                 num_experts_per_tok=2, router_aux_loss_coef=0.05, output_router_logits=True, rms_norm_eps=1e-5,
                 sliding_window=4, layer_types=["full_attention", "sliding_attention"], swiglu_limit=1.5,
                 max_position_embeddings=2048,
                 rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0,
                                      beta_slow=1.0, truncate=False, original_max_position_embeddings=64),
                 tie_word_embeddings=False, attention_bias=True),
        targets=["q_proj", "o_proj"],
    ),
    # qwen3_5 (Qwen3_5ForCausalLM, saved as model_type qwen3_5_text): Gated DeltaNet layers 0 and 2 (conv kernel 3,
    # 2 key heads of 6 serving 4 value heads of 5) around a full-attention layer 1 with the doubled q_proj (q and its
    # output gate), per-head (1 + w) q/k norms and partial RoPE (0.5 of head_dim 8), (1 + w) RMSNorms; LoRA on every
    # projection of both mixers and the MLP (peft's names).
    "qwen3_5": dict(
        cls="Qwen3_5ForCausalLM",
        cfg=dict(model_type="qwen3_5_text", vocab_size=61, hidden_size=24, intermediate_size=20, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                 layer_types=["linear_attention", "full_attention", "linear_attention"], linear_conv_kernel_dim=3,
                 linear_key_head_dim=6, linear_value_head_dim=5, linear_num_key_heads=2, linear_num_value_heads=4,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
                 tie_word_embeddings=False),
        targets=["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "q_proj", "k_proj", "v_proj",
                 "o_proj", "gate_proj", "up_proj", "down_proj"],
    ),
    # qwen3_5_moe (Qwen3_5MoeForCausalLM, saved as model_type qwen3_5_moe_text, experts per expert): qwen3_5's layers
    # with 5 experts top-2 (always renormalised) and a shared expert of 10 gated by sigmoid(shared_expert_gate), aux
    # loss in the loss. peft does not convert this family's targets: gate_proj / up_proj / down_proj are the shared
    # expert's modules, and the routed experts are LoRA'd through target_parameters.
    "qwen3_5_moe": dict(
        cls="Qwen3_5MoeForCausalLM",
        cfg=dict(model_type="qwen3_5_moe_text", vocab_size=61, hidden_size=24, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                 layer_types=["linear_attention", "full_attention", "linear_attention"], linear_conv_kernel_dim=3,
                 linear_key_head_dim=6, linear_value_head_dim=5, linear_num_key_heads=2, linear_num_value_heads=4,
                 num_experts=5, num_experts_per_tok=2, moe_intermediate_size=6, shared_expert_intermediate_size=10,
                 router_aux_loss_coef=0.05, output_router_logits=True,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
                 tie_word_embeddings=False),
        targets=["in_proj_qkv", "out_proj", "q_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                 "shared_expert_gate"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
    ),
    # qwen3_next (Qwen3NextForCausalLM, experts per expert): qwen3_5_moe's mixers with the fused projections
    # in_proj_qkvz / in_proj_ba in their per-key-head grouped layout (2 key heads of 6, each serving 2 value heads of
    # 5), layer 1 a dense MLP (mlp_only_layers) among sparse layers 0 and 2, 5 experts top-2 not renormalised
    # (norm_topk_prob false), a sigmoid-gated shared expert of 10, aux loss in the loss. peft converts this family's
    # targets (conversion pattern qwen2_moe): gate_proj / up_proj / down_proj become the routed experts' parameters
    # (gate_up_proj at rank 2r), so neither the shared expert's nor the dense layer's MLP modules are LoRA'd.
    "qwen3_next": dict(
        cls="Qwen3NextForCausalLM",
        cfg=dict(model_type="qwen3_next", vocab_size=61, hidden_size=24, intermediate_size=14, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                 layer_types=["linear_attention", "full_attention", "linear_attention"], linear_conv_kernel_dim=3,
                 linear_key_head_dim=6, linear_value_head_dim=5, linear_num_key_heads=2, linear_num_value_heads=4,
                 num_experts=5, num_experts_per_tok=2, norm_topk_prob=False, moe_intermediate_size=6,
                 shared_expert_intermediate_size=10, decoder_sparse_step=1, mlp_only_layers=[1],
                 router_aux_loss_coef=0.05, output_router_logits=True,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
                 tie_word_embeddings=False),
        targets=["in_proj_qkvz", "in_proj_ba", "out_proj", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                 "up_proj", "down_proj", "shared_expert_gate"],
    ),
}

# A tied config over a checkpoint that stores its own, different lm_head.weight: transformers keeps the stored
# head untied (and warns). The qwen2 and gemma3 cases' configs and weights with a random head added;
# gemma3_stored_head's config.json leaves tie_word_embeddings out (Gemma3TextConfig ties by default).
CASES["qwen2_stored_head"] = dict(CASES["qwen2"], stored_head=True)
CASES["gemma3_stored_head"] = dict(CASES["gemma3"], stored_head=True, tie_by_default=True)

MXFP4_SKIP = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def set_mxfp4_experts(model):
    """Random MXFP4 expert weights: {param name: (blocks [E, N, K/32, 16], scales [E, N, K/32])}, the model's
    dense [E, K, N] experts set to transformers' dequantisation of them."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    g = torch.Generator().manual_seed(31)
    packed = {}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj"):
                E, K, N = p.shape
                blocks = torch.randint(0, 256, (E, N, K // 32, 16), generator=g, dtype=torch.uint8)
                scales = torch.randint(127 - 4, 127 - 1, (E, N, K // 32), generator=g, dtype=torch.uint8)
                p.copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
                packed[n] = (blocks, scales)
    return packed


def write_mxfp4_checkpoint(d, packed, model):
    """Replace the saved dense experts by their blocks/scales and mark the config quant_method mxfp4; then
    check transformers loads the dir back (dequantising on CPU) to the very same logits."""
    from safetensors.torch import load_file
    path = os.path.join(d, "model.safetensors")
    sd = load_file(path)
    for n, (blocks, scales) in packed.items():
        del sd[n]
        sd[n + "_blocks"] = blocks
        sd[n + "_scales"] = scales
    save_file(sd, path, metadata={"format": "pt"})
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    c["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": MXFP4_SKIP}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")
    back = transformers.AutoModelForCausalLM.from_pretrained(
        d, quantization_config=transformers.Mxfp4Config(dequantize=True), dtype=torch.float32).eval()
    back.config._experts_implementation = "eager"
    ids = torch.arange(7).reshape(1, 7) % model.config.vocab_size
    with torch.no_grad():
        assert torch.equal(back(input_ids=ids).logits, model(input_ids=ids).logits), "mxfp4 round trip"

def write_stored_head(d, spec):
    """Adds an lm_head.weight of its own (not the embeddings) to the saved dir, whose config ties the two, and loads
    the dir back as from_pretrained does: the stored head is kept, untied. Returns that model."""
    from safetensors.torch import load_file
    path = os.path.join(d, "model.safetensors")
    sd = load_file(path)
    assert "lm_head.weight" not in sd, "save_pretrained wrote a tied head"
    g = torch.Generator().manual_seed(5)
    sd["lm_head.weight"] = 0.2 * torch.randn(sd["model.embed_tokens.weight"].shape, generator=g)
    save_file(sd, path, metadata={"format": "pt"})
    if spec.get("tie_by_default"):
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        del c["tie_word_embeddings"]
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f, indent=2, sort_keys=True)
            f.write("\n")
    back = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    assert back.config.tie_word_embeddings, "the config ties"
    assert torch.equal(back.lm_head.weight, sd["lm_head.weight"]), "transformers keeps the stored head"
    assert not torch.equal(back.lm_head.weight, back.model.embed_tokens.weight)
    return back


B, S = 2, 7


def make_case(name, spec):
    torch.manual_seed(1234)
    cfg_cls = transformers.AutoConfig.for_model(spec["cfg"]["model_type"]).__class__
    kw = dict(spec["cfg"])
    kw.pop("model_type")
    cfg = cfg_cls(**kw)
    cfg._experts_implementation = "eager"  # the reference loop: grouped_mm needs 16-byte strides on CPU
    cfg._attn_implementation = "eager"
    cfg.initializer_range = 0.2  # larger than default so logits are far from uniform
    model = getattr(transformers, spec["cls"])(cfg).eval()
    # Norm weights at 1 would hide a missing norm: perturb them.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
            # gpt_oss: sinks at init std are too small to matter, biases at init are zero: make both count.
            if n.endswith(".sinks"):
                p.copy_(1.5 * torch.randn_like(p))
            if n.endswith("_bias") or n.endswith("router.bias"):
                p.copy_(0.2 * torch.randn_like(p))
    if spec.get("prepare"):  # a case's own setup of what the loop above leaves (buffers: scripts/goldens/make_deepseek_glm_goldens.py)
        spec["prepare"](model)
    packed = set_mxfp4_experts(model) if spec.get("mxfp4") else None
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d)
    if packed:
        write_mxfp4_checkpoint(d, packed, model)
    if spec.get("stored_head"):
        model = write_stored_head(d, spec)

    torch.manual_seed(99)
    lcfg = LoraConfig(r=2, lora_alpha=5, target_modules=list(spec["targets"]), lora_dropout=0.0,
                      target_parameters=spec.get("target_parameters"))
    pm = get_peft_model(model, lcfg)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(0.3 * torch.randn_like(p))
    pm.save_pretrained(os.path.join(d, "adapter"))

    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, cfg.vocab_size, (B, S), generator=g)
    labels = ids.clone()
    labels[0, 2] = -100
    out = pm(input_ids=ids, labels=labels)
    out.loss.backward()
    golden = {"input_ids": ids, "labels": labels, "logits": out.logits.detach().contiguous(),
              "loss": out.loss.detach().reshape(1)}
    if getattr(out, "aux_loss", None) is not None:
        golden["aux_loss"] = out.aux_loss.detach().reshape(1)
    elif cfg.model_type in ("qwen3_moe", "mixtral", "olmoe", "qwen3_5_moe_text", "qwen3_next"):
        # output_router_logits off: the aux loss is not part of the loss; compute it for the test anyway.
        out2 = pm(input_ids=ids, output_router_logits=True)
        golden["aux_loss"] = out2.aux_loss.detach().reshape(1)
    for n, p in pm.named_parameters():
        if p.requires_grad:
            key = n.replace(".default", "")  # peft's on-disk key for this factor
            golden["grad." + key] = p.grad.detach().contiguous()
    save_file(golden, os.path.join(d, "golden.safetensors"))
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
    assert total < 300_000, f"{name}: {total} bytes"
    print(f"{name}: loss {out.loss.item():.6f}, {total} bytes")


def make_aux_mask_golden(name):
    """The router aux loss with padding left out, as transformers computes it from an attention mask
    (load_balancing_loss_func): <case>/aux_mask.safetensors holds input_ids [B, S], attention_mask (row 0 ends in
    3 padding tokens, row 1 in 1) and aux_loss. Reads the saved model dir, so the case's other files stay as
    they are."""
    d = os.path.join(OUT, name)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    model.config._experts_implementation = "eager"
    g = torch.Generator().manual_seed(8)
    ids = torch.randint(0, model.config.vocab_size, (B, S), generator=g)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[0, S - 3:] = 0
    mask[1, S - 1:] = 0
    with torch.no_grad():
        # Padding ends each row, so the real tokens (causal) route the same with or without the mask; the
        # mask only takes the padding out of the aux loss.
        pos = torch.arange(S).repeat(B, 1)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, output_router_logits=True)
        unmasked = model(input_ids=ids, position_ids=pos, output_router_logits=True).aux_loss
    save_file({"input_ids": ids, "attention_mask": mask, "aux_loss": out.aux_loss.detach().reshape(1),
               "aux_loss_unmasked": unmasked.detach().reshape(1)}, os.path.join(d, "aux_mask.safetensors"))
    print(f"{name}: aux loss {out.aux_loss.item():.6f} with padding left out, {unmasked.item():.6f} with it")


def make_gemma3_v4_config():
    """gemma3/config_v4.json: the gemma3 case's config in transformers 4's spelling (rope_theta for the global
    layers, rope_local_base_freq for the sliding ones, rope_scaling on the global), asserted here to read back as
    the same rope_parameters: tests/unit/model_gemma3_olmoe_test.cpp loads it and expects the same logits."""
    d = os.path.join(OUT, "gemma3")
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    v4 = dict(cfg)
    rp = v4.pop("rope_parameters")
    v4["rope_theta"] = rp["full_attention"]["rope_theta"]
    v4["rope_local_base_freq"] = rp["sliding_attention"]["rope_theta"]
    v4["rope_scaling"] = {k: v for k, v in rp["full_attention"].items() if k != "rope_theta"}
    kw = {k: v for k, v in v4.items() if k not in ("model_type", "transformers_version", "architectures")}
    assert transformers.Gemma3TextConfig(**kw).rope_parameters == rp, "transformers reads the 4.x spelling differently"
    with open(os.path.join(d, "config_v4.json"), "w") as f:
        json.dump(v4, f, indent=2)
        f.write("\n")
    print("gemma3: config_v4.json")


# RoPE parameter sets for tests/data/rope_goldens.json: transformers' inverse frequencies and attention
# factor for each (LlamaConfig fields; seq_len = the batch's longest position + 1, dynamic's input).
ROPE_CASES = [
    dict(head_dim=16, max_position_embeddings=256, seq_len=7,
         rope_parameters=dict(rope_type="yarn", rope_theta=100.0, factor=4.0, original_max_position_embeddings=64)),
    dict(head_dim=64, max_position_embeddings=32768, seq_len=7,  # Qwen2.5's long-context setting
         rope_parameters=dict(rope_type="yarn", rope_theta=1e6, factor=4.0, original_max_position_embeddings=32768)),
    dict(head_dim=32, max_position_embeddings=4096, seq_len=7,  # DeepSeek-style mscale / mscale_all_dim, betas
         rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=512,
                              mscale=1.0, mscale_all_dim=0.707, beta_fast=16, beta_slow=2)),
    dict(head_dim=32, max_position_embeddings=4096, seq_len=7,  # explicit attention_factor, no truncation
         rope_parameters=dict(rope_type="yarn", rope_theta=50000.0, factor=8.0, original_max_position_embeddings=512,
                              attention_factor=0.8, truncate=False)),
    dict(head_dim=16, max_position_embeddings=5, seq_len=7,
         rope_parameters=dict(rope_type="dynamic", rope_theta=500.0, factor=3.0)),
    dict(head_dim=64, max_position_embeddings=2048, seq_len=3000,
         rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0)),
    dict(head_dim=64, max_position_embeddings=2048, seq_len=2048,  # not beyond: the plain frequencies
         rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0)),
]


def make_rope_goldens():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    out = []
    for case in ROPE_CASES:
        case = dict(case)
        seq_len = case.pop("seq_len")
        cfg = transformers.LlamaConfig(hidden_size=case["head_dim"] * 2, num_attention_heads=2, **case)
        rp = cfg.rope_parameters
        inv, att = ROPE_INIT_FUNCTIONS[rp["rope_type"]](cfg, "cpu", seq_len=torch.tensor(seq_len))
        config = dict(model_type="llama", vocab_size=10, hidden_size=case["head_dim"] * 2, intermediate_size=4,
                      num_hidden_layers=1, num_attention_heads=2, **case)
        out.append(dict(config=config, seq_len=seq_len, inv_freq=[float(x) for x in inv], attention_factor=float(att)))
    with open(os.path.join(OUT, "..", "rope_goldens.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"rope_goldens.json: {len(out)} cases")


VL_FORMS = {  # the multimodal form of a text case: (its config and model classes, the text case)
    "qwen3_5_vl": ("Qwen3_5Config", "Qwen3_5ForConditionalGeneration", "qwen3_5"),
    "qwen3_5_moe_vl": ("Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe"),
}


def make_vl_case(name):
    """qwen3_5_vl/, qwen3_5_moe_vl/: the multimodal checkpoint form (Qwen3_5ForConditionalGeneration, model_type
    qwen3_5; Qwen3_5MoeForConditionalGeneration, qwen3_5_moe: the text config nested in text_config, the language
    model under model.language_model.*, a vision tower under model.visual.* that axengine does not read) with the
    text case's weights and a tiny tower; a peft adapter made on the multimodal model (its module paths:
    model.language_model.layers...), and the golden of a text-only batch. The same layout and files as make_case."""
    cfg_cls, model_cls, text_case = VL_FORMS[name]
    spec = CASES[text_case]
    text = {k: v for k, v in spec["cfg"].items() if k != "model_type"}
    vision = dict(depth=1, hidden_size=8, intermediate_size=16, num_heads=2, patch_size=2, temporal_patch_size=2,
                  spatial_merge_size=2, out_hidden_size=text["hidden_size"], num_position_embeddings=16)
    # Token ids inside the tiny vocabulary (the defaults are Qwen3.5's 248k-vocabulary ones).
    cfg = getattr(transformers, cfg_cls)(text_config=text, vision_config=vision, image_token_id=57, video_token_id=58,
                                         vision_start_token_id=59, vision_end_token_id=60, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    cfg.text_config._experts_implementation = "eager"
    torch.manual_seed(4321)
    model = getattr(transformers, model_cls)(cfg).eval()
    # The text case's weights (so both forms are the same language model); experts as the model holds them.
    from safetensors.torch import load_file
    text_model = getattr(transformers, spec["cls"]).from_pretrained(os.path.join(OUT, text_case), dtype=torch.float32)
    dense = text_model.state_dict()
    sd = model.state_dict()
    with torch.no_grad():
        for k, v in dense.items():
            key = "lm_head.weight" if k == "lm_head.weight" else "model.language_model." + k[len("model."):]
            sd[key].copy_(v)
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d)
    from safetensors import safe_open
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert any(k.startswith("model.visual.") for k in keys) and any(k.startswith("model.language_model.") for k in keys), keys[:5]
    torch.manual_seed(99)
    lcfg = LoraConfig(r=2, lora_alpha=5, target_modules=list(spec["targets"]), lora_dropout=0.0,
                      target_parameters=spec.get("target_parameters"))
    pm = get_peft_model(model, lcfg)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(0.3 * torch.randn_like(p))
    assert not any("visual" in n for n, p in pm.named_parameters() if p.requires_grad), "LoRA on the tower"
    pm.save_pretrained(os.path.join(d, "adapter"))
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 50, (B, S), generator=g)
    labels = ids.clone()
    labels[0, 2] = -100
    out = pm(input_ids=ids, labels=labels)
    out.loss.backward()
    golden = {"input_ids": ids, "labels": labels, "logits": out.logits.detach().contiguous(),
              "loss": out.loss.detach().reshape(1)}
    if getattr(out, "aux_loss", None) is not None:
        golden["aux_loss"] = out.aux_loss.detach().reshape(1)
    for n, p in pm.named_parameters():
        if p.requires_grad:
            golden["grad." + n.replace(".default", "")] = p.grad.detach().contiguous()
    save_file(golden, os.path.join(d, "golden.safetensors"))
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
    assert total < 300_000, f"{name}: {total} bytes"
    print(f"{name}: loss {out.loss.item():.6f}, {total} bytes")


def main():
    assert transformers.__version__ == "5.23.0" and peft.__version__ == "0.21.2", "pinned peers expected"
    torch.set_grad_enabled(True)
    names = sys.argv[1:] or list(CASES)
    if names == ["rope"]:
        make_rope_goldens()
        return
    if names and all(n in VL_FORMS for n in names):  # the multimodal forms, from the committed text cases
        for n in names:
            make_vl_case(n)
        return
    if names == ["aux_mask"]:  # only the aux-loss masks, from the committed model dirs
        for n in ("qwen3_moe", "qwen3_moe_top1"):
            make_aux_mask_golden(n)
        return
    for n in names:
        make_case(n, CASES[n])
    for n in ("qwen3_moe", "qwen3_moe_top1"):
        if n in names:
            make_aux_mask_golden(n)
    for vl, (_, _, text_case) in VL_FORMS.items():
        if text_case in names:
            make_vl_case(vl)
    if "gemma3" in names:  # the gemma3 case's own config (not gemma3_stored_head's)
        make_gemma3_v4_config()
    if not sys.argv[1:]:
        make_rope_goldens()


if __name__ == "__main__":
    main()
