#!/usr/bin/env python3
"""What transformers' config classes take for the config.json keys axengine reads, when a config leaves them out.

Writes tests/data/models/config_defaults.json: a list of cases, each
  name      "<family>/<variant>"
  config    a minimal config.json: model_type and the sizes axengine requires (vocab_size, hidden_size,
            num_hidden_layers, num_attention_heads, intermediate_size, the expert counts), plus the keys a
            variant sets to reach a derived default (use_sliding_window, to see max_window_layers at work)
  expect    what the family's transformers 5.23 config class (and, where the class leaves it to the model, the
            modeling code's own fallback: head_dim, mrope_section) makes of it, in HfConfig's terms: the value
            of every key axengine reads and of every quantity derived from them (head_dim, num_kv_heads,
            the window of each layer, the RoPE parameters with yarn's attention factor, ...)

Variants: "class" (the config class instantiated with no arguments: the sizes are its own defaults too),
"small" (small sizes given, so that derivations like head_dim = hidden_size / heads show), and per family a
variant that turns on what only then derives (qwen2's sliding layers from max_window_layers). qwen2_5_vl is
read as Qwen2_5_VLConfig reads it, the text keys nested in text_config (transformers 5) and at the top level
(transformers 4, "flat"). qwen3_vl_moe is read as Qwen3VLMoeConfig reads it (text_config, a Qwen3VLMoeTextConfig):
its language model's keys.

tests/unit/model_config_defaults_test.cpp parses each config with axengine and compares.
Run with the project venv:  /root/.cache/axengine/venv/bin/python scripts/goldens/make_config_defaults_goldens.py
"""
import json
import os

import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLConfig
from transformers.models.qwen3_vl_moe.configuration_qwen3_vl_moe import Qwen3VLMoeConfig

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "models",
                   "config_defaults.json")

CLASSES = {
    "llama": transformers.LlamaConfig,
    "mistral": transformers.MistralConfig,
    "qwen2": transformers.Qwen2Config,
    "qwen3": transformers.Qwen3Config,
    "qwen3_moe": transformers.Qwen3MoeConfig,
    "mixtral": transformers.MixtralConfig,
    "gemma3_text": transformers.Gemma3TextConfig,
    "olmoe": transformers.OlmoeConfig,
    "gpt_oss": transformers.GptOssConfig,
    "qwen3_5": transformers.Qwen3_5TextConfig,  # Qwen3_5ForCausalLM's; the multimodal config's text_config
    "qwen3_5_moe": transformers.Qwen3_5MoeTextConfig,
    "qwen3_next": transformers.Qwen3NextConfig,
    "glm4_moe": transformers.Glm4MoeConfig,
    "deepseek_v3": transformers.DeepseekV3Config,
}

# The sizes axengine requires of each family's config.json (everything else has a default).
DENSE = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"]
REQUIRED = {
    "qwen3_moe": DENSE + ["moe_intermediate_size", "num_experts", "num_experts_per_tok"],
    "mixtral": DENSE + ["num_local_experts", "num_experts_per_tok"],
    "olmoe": DENSE + ["num_experts", "num_experts_per_tok"],
    "gpt_oss": DENSE + ["num_local_experts", "num_experts_per_tok"],
    "qwen3_5_moe": ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"],  # the rest has defaults
    "qwen3_next": ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"],
    "glm4_moe": ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"],
    # num_key_value_heads: the class's 128 fits its own 128 heads only (MLA repeats no kv head): given with the sizes.
    "deepseek_v3": ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"],
}
# hidden / heads = 8: a derived head_dim shows as 8, not as a class constant (qwen3 128, gemma3 256, gpt_oss 64);
# 32 heads are a multiple of every class's default num_key_value_heads; 7 layers show gemma3's pattern of 6.
SMALL = dict(vocab_size=128, hidden_size=256, num_hidden_layers=7, num_attention_heads=32, num_key_value_heads=32,
             intermediate_size=96,
             moe_intermediate_size=32, num_experts=4, num_local_experts=4, num_experts_per_tok=2)
# Qwen2.5-VL: the default mrope_section [16, 24, 24] needs head_dim 128 and the default image token ids a
# vocabulary above 151656; 16 heads take the default 8 kv heads.
VL_SMALL = dict(vocab_size=152064, hidden_size=2048, num_hidden_layers=7, num_attention_heads=16, intermediate_size=96)

MOE_FAMILIES = ("qwen3_moe", "mixtral", "olmoe", "gpt_oss", "qwen3_5_moe", "qwen3_next")


def rope(cfg, params):
    """A RopeConfig in axengine's terms, with transformers' attention factor for the type."""
    out = {"type": params["rope_type"], "theta": float(params["rope_theta"])}
    if out["type"] != "default":
        out["factor"] = float(params["factor"])
    if out["type"] == "yarn":
        out.update(beta_fast=float(params.get("beta_fast") or 32), beta_slow=float(params.get("beta_slow") or 1),
                   truncate=bool(params.get("truncate", True)),
                   original_max_position=int(params.get("original_max_position_embeddings")
                                             or cfg.max_position_embeddings))
    if out["type"] in ("yarn", "linear", "default"):
        # _compute_yarn_parameters reads config.rope_parameters; a per-layer-type config (gemma3) passes its type.
        fn = ROPE_INIT_FUNCTIONS.get(out["type"]) if out["type"] != "default" else None
        if fn is not None:
            _, att = fn(cfg, "cpu")
            out["attention_factor"] = float(att)
        else:
            out["attention_factor"] = 1.0
    return out


def windows(family, cfg):
    """The attention window of each layer, -1 = full: what each modeling file applies."""
    n = cfg.num_hidden_layers
    types = getattr(cfg, "layer_types", None)
    sw = getattr(cfg, "sliding_window", None)
    if types is not None:
        return [sw if t == "sliding_attention" else -1 for t in types]
    if family in ("mistral", "mixtral", "qwen3_moe") and sw is not None:  # one window on every layer
        return [sw] * n
    return [-1] * n


def expect(family, cfg, tie):
    e = {
        "num_kv_heads": cfg.num_key_value_heads,
        # The modeling files' own fallback (getattr(config, "head_dim", None) or hidden // heads).
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": bool(tie),
        "layer_window": windows(family, cfg),
        "mlp_act": getattr(cfg, "hidden_activation", None) or cfg.hidden_act,
    }
    if family == "gemma3_text":
        rp = cfg.rope_parameters
        e["rope"] = rope(cfg, rp["full_attention"])
        e["rope_local"] = rope(cfg, rp["sliding_attention"])
        e["attn_scale"] = cfg.query_pre_attn_scalar ** -0.5
    else:
        e["rope"] = rope(cfg, cfg.rope_parameters)
    # Biases: the attention_bias key where the class has it (all four projections); Qwen2Attention builds q/k/v
    # biases and none on o_proj whatever the config says.
    if family in ("qwen2", "qwen2_5_vl"):
        e["qkv_bias"], e["o_bias"] = True, False
    elif family == "glm4_moe":  # Glm4MoeAttention: attention_bias on q/k/v, never on o_proj
        e["qkv_bias"], e["o_bias"] = bool(cfg.attention_bias), False
    else:
        e["qkv_bias"] = e["o_bias"] = bool(getattr(cfg, "attention_bias", False))
    e["mlp_bias"] = bool(getattr(cfg, "mlp_bias", False))
    if family in MOE_FAMILIES:
        e["router_aux_loss_coef"] = cfg.router_aux_loss_coef
        e["output_router_logits"] = cfg.output_router_logits
    if family in ("qwen3_moe", "olmoe", "qwen3_next"):
        e["norm_topk_prob"] = cfg.norm_topk_prob
    if family == "mixtral":
        e["norm_topk_prob"] = True  # MixtralTopKRouter always renormalises the top-k weights
    if family in ("qwen3_moe", "qwen3_next"):
        e["decoder_sparse_step"] = cfg.decoder_sparse_step
        e["mlp_only_layers"] = list(cfg.mlp_only_layers)
    if family == "olmoe":
        e["clip_qkv"] = cfg.clip_qkv or 0.0
    if family == "gpt_oss":
        e["swiglu_alpha"] = cfg.swiglu_alpha
        e["swiglu_limit"] = cfg.swiglu_limit
    if family == "qwen3_5_moe":
        e["norm_topk_prob"] = True  # Qwen3_5MoeTopKRouter always renormalises
        e["moe"] = [cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size]
    if family == "qwen3_next":
        # The sparse layers' sizes, and the dense layers' MLP (mlp_only_layers) of intermediate_size.
        e["moe"] = [cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size]
        e["intermediate_size"] = cfg.intermediate_size
    if family in ("qwen3_5", "qwen3_5_moe", "qwen3_next"):
        # The layer pattern (full_attention_interval 4), the Gated DeltaNet's sizes, the partial RoPE's rotary dim
        # (modeling: int(head_dim * partial_rotary_factor)).
        e["linear_layers"] = [t == "linear_attention" for t in cfg.layer_types]
        e["gdn"] = [cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                    cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim]
        e["rotary_dim"] = int(e["head_dim"] * cfg.rope_parameters.get("partial_rotary_factor", 1.0))
    if family in ("glm4_moe", "deepseek_v3"):
        # The routed experts (sizes, groups, scale), the shared experts' GLU (n_shared_experts · moe_intermediate_size),
        # the dense first layers.
        e["moe"] = [cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
                    cfg.n_shared_experts * cfg.moe_intermediate_size]
        e["group_moe"] = [cfg.n_group, cfg.topk_group]
        e["routed_scaling_factor"] = cfg.routed_scaling_factor
        e["norm_topk_prob"] = cfg.norm_topk_prob
        e["mlp_only_layers"] = list(range(min(cfg.first_k_dense_replace, cfg.num_hidden_layers)))
    if family == "glm4_moe":
        e["rotary_dim"] = int(e["head_dim"] * cfg.rope_parameters.get("partial_rotary_factor", 1.0))
    if family == "deepseek_v3":
        e["mla"] = [cfg.q_lora_rank or 0, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim,
                    int(cfg.rope_interleave)]
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale
        e["mla_softmax_scale"] = yarn_apply_mscale(cfg.rope_parameters, cfg.qk_head_dim ** -0.5)
    if family == "qwen3_vl_moe":
        # Qwen3VLMoeTextTopKRouter always renormalises; Qwen3VLMoeTextDecoderLayer's sparse layers; the dense MLP's
        # intermediate_size beside the experts'.
        e["router_aux_loss_coef"] = cfg.router_aux_loss_coef
        e["output_router_logits"] = cfg.output_router_logits
        e["norm_topk_prob"] = True
        e["decoder_sparse_step"] = cfg.decoder_sparse_step
        e["mlp_only_layers"] = list(cfg.mlp_only_layers)
        e["moe"] = [cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, 0]
        e["intermediate_size"] = cfg.intermediate_size
    if family == "qwen2_5_vl":
        # Qwen2_5_VLRotaryEmbedding: config.rope_parameters.get("mrope_section", [16, 24, 24]).
        e["mrope_section"] = list(cfg.rope_parameters.get("mrope_section", [16, 24, 24]))
    return e


def family_case(family, variant, sizes, extra=None):
    cls = CLASSES[family]
    keys = REQUIRED.get(family, DENSE)
    if sizes is None:  # the class's own sizes
        base = cls()
        sizes = {k: getattr(base, k) for k in keys}
    kw = {k: sizes[k] for k in keys}
    kw.update(extra or {})
    cfg = cls(**kw)
    config = {"model_type": family, **kw}
    return {"name": f"{family}/{variant}", "config": config,
            "expect": expect(family, cfg, getattr(cfg, "tie_word_embeddings", False))}


def vl_case(variant, sizes, extra=None, flat=False):
    text_keys = DENSE
    if sizes is None:
        base = Qwen2_5_VLConfig().text_config
        sizes = {k: getattr(base, k) for k in text_keys}
    text = {k: sizes[k] for k in text_keys}
    text.update(extra or {})
    # The vision tower's defaults hold but its output must match the text hidden size.
    vision = {"out_hidden_size": text["hidden_size"]}
    if flat:
        config = {"model_type": "qwen2_5_vl", **text, "vision_config": vision}
        cfg = Qwen2_5_VLConfig(**{k: v for k, v in config.items() if k != "model_type"})
    else:
        config = {"model_type": "qwen2_5_vl", "text_config": text, "vision_config": vision}
        cfg = Qwen2_5_VLConfig(text_config=dict(text), vision_config=dict(vision))
    return {"name": f"qwen2_5_vl/{variant}", "config": config,
            "expect": expect("qwen2_5_vl", cfg.text_config, cfg.tie_word_embeddings)}


def vl_moe_case(variant, text):
    """Qwen3VLMoeConfig with `text` as its text_config (the vision tower's output matched to its hidden size)."""
    hidden = text.get("hidden_size", Qwen3VLMoeConfig().text_config.hidden_size)
    config = {"model_type": "qwen3_vl_moe", "text_config": dict(text), "vision_config": {"out_hidden_size": hidden}}
    cfg = Qwen3VLMoeConfig(text_config=dict(text), vision_config={"out_hidden_size": hidden})
    return {"name": f"qwen3_vl_moe/{variant}", "config": config,
            "expect": expect("qwen3_vl_moe", cfg.text_config, cfg.tie_word_embeddings)}


def main():
    assert transformers.__version__ == "5.23.0", "pinned peer expected"
    torch.set_grad_enabled(False)
    cases = []
    for family in CLASSES:
        # Glm4MoeConfig's 4096 / 96 heads floor to head_dim 42 (q_proj narrower than hidden): axengine refuses a
        # hidden_size that is no multiple of the heads without head_dim, so the class case gives GLM-4.5's 128.
        cases.append(family_case(family, "class", None, {"head_dim": 128} if family == "glm4_moe" else None))
        cases.append(family_case(family, "small", SMALL))
    # Qwen2: the sliding window (default 4096) from max_window_layers (default 28) on, when use_sliding_window.
    cases.append(family_case("qwen2", "sliding", dict(SMALL, num_hidden_layers=30), {"use_sliding_window": True}))
    # Qwen3.5: layer_types from full_attention_interval 3 (the class pops it when layer_types is not given).
    cases.append(family_case("qwen3_5", "interval", SMALL, {"full_attention_interval": 3}))
    # Qwen3-Next: a dense layer among the sparse ones (mlp_only_layers), every other layer sparse, the interval.
    cases.append(family_case("qwen3_next", "sparse", SMALL, {"mlp_only_layers": [1], "decoder_sparse_step": 2,
                                                            "full_attention_interval": 2}))
    # DeepSeek-V3 with q_lora_rank null and the YaRN of its hub config (mscale_all_dim: the softmax scale's factor).
    cases.append(family_case("deepseek_v3", "yarn", SMALL, {
        "q_lora_rank": None, "rope_interleave": False,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 1.0,
                            "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
                            "original_max_position_embeddings": 4096}}))
    cases.append(vl_case("class", None))
    cases.append(vl_case("small", VL_SMALL))
    cases.append(vl_case("flat", VL_SMALL, flat=True))
    # Qwen2_5_VLTextConfig's max_window_layers is 80, not Qwen2's 28.
    cases.append(vl_case("sliding", dict(VL_SMALL, num_hidden_layers=82), {"use_sliding_window": True}))
    # Qwen3-VL-MoE: the classes' own sizes; small ones (head_dim 128 for the default mrope_section, a vocabulary
    # above the image token ids); a dense layer and every other layer sparse, with a norm_topk_prob the router ignores.
    cases.append(vl_moe_case("class", {}))
    vl_moe_small = dict(VL_SMALL, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)
    cases.append(vl_moe_case("small", vl_moe_small))
    cases.append(vl_moe_case("sparse", dict(vl_moe_small, decoder_sparse_step=2, mlp_only_layers=[1], norm_topk_prob=False)))
    with open(OUT, "w") as f:
        json.dump(cases, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"config_defaults.json: {len(cases)} cases")


if __name__ == "__main__":
    main()
