#!/usr/bin/env python3
"""Parity goldens for the glm4_moe and deepseek_v3 families, made by HF transformers 5.23 + peft 0.21.2 on CPU in
fp32, in the layout of make_model_goldens.py (whose make_case writes each tests/data/models/<case>/: config.json,
model.safetensors as save_pretrained writes it, a peft adapter, golden.safetensors with logits, loss and every
LoRA factor's gradient) plus generate_golden.json (make_generate_goldens.py: greedy generation with the adapter).

The router's e_score_correction_bias is a buffer (not a parameter): transformers initialises it to zeros, so each
case sets it to random values large enough to change which experts are chosen (asserted below), else a model that
ignored it would pass.

Run with the project venv:  ~/.cache/axengine/venv/bin/python scripts/goldens/make_deepseek_glm_goldens.py [case...]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_generate_goldens as gen  # noqa: E402
import make_model_goldens as mmg  # noqa: E402

EXPERT_TARGETS = ["gate_proj", "up_proj", "down_proj"]  # peft's MoE conversion: the routed experts' fused tensors


def random_correction_bias(model):
    """e_score_correction_bias of every router to N(0, 0.5): a sigmoid score is in (0, 1), so this reorders the
    choice. Checked: on random inputs the biased choice differs from the unbiased one."""
    g = torch.Generator().manual_seed(17)
    n = 0
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buf.copy_(0.5 * torch.randn(buf.shape, generator=g))
            n += 1
            gate = model.get_submodule(name.rsplit(".", 1)[0])
            x = torch.randn(64, gate.weight.shape[1], generator=g)
            with torch.no_grad():
                _, _, biased = gate(x)
                saved = buf.clone()
                buf.zero_()
                _, _, plain = gate(x)
                buf.copy_(saved)
            assert not torch.equal(biased.sort(-1)[0], plain.sort(-1)[0]), f"{name} does not change the choice"
    assert n > 0, "no router with a correction bias"


CASES = {
    # glm4_moe: q/k/v biases (none on o_proj), partial RoPE 0.5 of head_dim 8, GQA 4/2, layer 0 dense
    # (first_k_dense_replace 1), 6 experts in 3 groups, top-2 of the 2 best groups, 2 shared experts (one GLU of
    # 2 x 6), routed_scaling_factor 1.7; LoRA on attention and (by peft's conversion) the routed experts.
    "glm4_moe": dict(
        cls="Glm4MoeForCausalLM", prepare=random_correction_bias,
        cfg=dict(model_type="glm4_moe", vocab_size=53, hidden_size=24, intermediate_size=20, moe_intermediate_size=6,
                 num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8, n_routed_experts=6,
                 num_experts_per_tok=2, n_group=3, topk_group=2, n_shared_experts=2, first_k_dense_replace=1,
                 routed_scaling_factor=1.7, norm_topk_prob=True, use_qk_norm=False, attention_bias=True,
                 rms_norm_eps=1e-5, tie_word_embeddings=False,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5)),
        targets=["q_proj", "k_proj", "v_proj", "o_proj"] + EXPERT_TARGETS,
    ),
    # glm4_moe with q/k norms (use_qk_norm: the norm_rope path, partial 0.25 of head_dim 16), one group, top-3 of 5
    # not renormalised, every layer sparse, no attention bias.
    "glm4_moe_qknorm": dict(
        cls="Glm4MoeForCausalLM", prepare=random_correction_bias,
        cfg=dict(model_type="glm4_moe", vocab_size=41, hidden_size=16, intermediate_size=12, moe_intermediate_size=8,
                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16, n_routed_experts=5,
                 num_experts_per_tok=3, n_group=1, topk_group=1, n_shared_experts=1, first_k_dense_replace=0,
                 routed_scaling_factor=1.0, norm_topk_prob=False, use_qk_norm=True, attention_bias=False,
                 tie_word_embeddings=False,
                 rope_parameters=dict(rope_type="default", rope_theta=1000.0, partial_rotary_factor=0.25)),
        targets=["q_proj", "v_proj", "down_proj"],
    ),
    # deepseek_v3: MLA with q LoRA rank 10, latent 8, qk 6 + rope 4, v 5 (≠ 10), interleaved RoPE, YaRN with
    # mscale 1 / mscale_all_dim 0.8 (cos/sin factor ≠ 1 and the softmax scale's mscale² correction), layer 0 dense,
    # 8 experts in 4 groups (top-3 of the 2 best groups), routed_scaling_factor 2.5, one shared expert.
    "deepseek_v3": dict(
        cls="DeepseekV3ForCausalLM", prepare=random_correction_bias,
        cfg=dict(model_type="deepseek_v3", vocab_size=59, hidden_size=24, intermediate_size=20, moe_intermediate_size=6,
                 num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=3, q_lora_rank=10, kv_lora_rank=8,
                 qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, rope_interleave=True, n_routed_experts=8,
                 num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=1, first_k_dense_replace=1,
                 routed_scaling_factor=2.5, norm_topk_prob=True, attention_bias=False, rms_norm_eps=1e-6,
                 max_position_embeddings=160, tie_word_embeddings=False,
                 rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, mscale=1.0, mscale_all_dim=0.8,
                                      beta_fast=32.0, beta_slow=1.0, original_max_position_embeddings=4)),
        targets=["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"] + EXPERT_TARGETS,
    ),
    # deepseek_v3 with q_lora_rank null (a plain q_proj, as DeepSeek-V2-Lite / Moonlight), rotate-half RoPE
    # (rope_interleave false), attention biases (q_proj has none; kv_a_proj_with_mqa and o_proj do), default RoPE,
    # one group, top-2 of 6 not renormalised, every layer sparse, 2 shared experts.
    "deepseek_v3_qproj": dict(
        cls="DeepseekV3ForCausalLM", prepare=random_correction_bias,
        cfg=dict(model_type="deepseek_v3", vocab_size=47, hidden_size=16, intermediate_size=12, moe_intermediate_size=6,
                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=None, kv_lora_rank=6,
                 qk_nope_head_dim=4, qk_rope_head_dim=6, v_head_dim=8, rope_interleave=False, n_routed_experts=6,
                 num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=2, first_k_dense_replace=0,
                 routed_scaling_factor=1.5, norm_topk_prob=False, attention_bias=True, tie_word_embeddings=False,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        targets=["q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"],
    ),
}


def main():
    import peft
    import transformers
    assert transformers.__version__ == "5.23.0" and peft.__version__ == "0.21.2", "pinned peers expected"
    torch.set_grad_enabled(True)
    for n in sys.argv[1:] or list(CASES):
        mmg.make_case(n, CASES[n])
        gen.make(n)


if __name__ == "__main__":
    main()
