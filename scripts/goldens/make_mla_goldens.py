#!/usr/bin/env python3
"""Goldens for multi-head latent attention (DeepSeek-V3's MLA): transformers' own DeepseekV3Attention
(eager, CPU, fp32) on two packed sequences (lengths 5 and 3, each run alone from position 0 with a causal
mask, the outputs concatenated as the engine packs rows), forward and backward (autograd).

Cases:
  lora_interleave  q through q_a_proj -> q_a_layernorm -> q_b_proj (q_lora_rank 24), rope_interleave = True,
                   default RoPE
  qproj_yarn       a plain q_proj (q_lora_rank None), rope_interleave = False, YaRN RoPE with factor 4,
                   mscale 0.8 and mscale_all_dim 1.0: cos/sin carry an attention factor != 1 (the rope dims
                   only) and the softmax scale its mscale_all_dim correction
Per case <c>: x [T, H], every weight under its module name (<c>.<module>.weight), inv_freq, the attention
factor and softmax scale transformers uses, out [T, H], grad_out, and the gradients of x and of every weight.
Sizes: hidden 32, 4 heads, kv_lora_rank 16, qk_nope 8 + qk_rope 4 = qk 12, v_head_dim 6 (v != qk).

Pinned: torch 2.11.0, transformers 5.23.0 (tests/data/models/mla.meta.json).
Writes tests/data/models/mla.safetensors.
Run: ~/.cache/axengine/venv/bin/python scripts/goldens/make_mla_goldens.py
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "models")
LENGTHS = [5, 3]


def case(name, cfg, g, out):
    cfg._attn_implementation = "eager"
    attn = ds.DeepseekV3Attention(cfg, layer_idx=0).eval()
    rotary = ds.DeepseekV3RotaryEmbedding(cfg)
    with torch.no_grad():
        for n, p in attn.named_parameters():
            if n.endswith("layernorm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    T = sum(LENGTHS)
    x = torch.randn(T, cfg.hidden_size, generator=g).requires_grad_(True)
    outs = []
    start = 0
    for L in LENGTHS:
        xs = x[start:start + L].unsqueeze(0)
        pos = torch.arange(L).unsqueeze(0)
        cos, sin = rotary(xs, pos)
        mask = torch.full((L, L), float("-inf")).triu(1)[None, None]
        o, _ = attn(xs, (cos, sin), mask)
        outs.append(o[0])
        start += L
    y = torch.cat(outs, 0)
    gy = torch.randn(y.shape, generator=g)
    params = dict(attn.named_parameters())
    grads = torch.autograd.grad(y, [x] + list(params.values()), gy)
    out[f"{name}.x"] = x.detach()
    out[f"{name}.out"] = y.detach()
    out[f"{name}.grad_out"] = gy
    out[f"{name}.dx"] = grads[0]
    for (n, p), d in zip(params.items(), grads[1:]):
        out[f"{name}.{n}"] = p.detach().clone()
        out[f"{name}.d.{n}"] = d
    out[f"{name}.inv_freq"] = rotary.inv_freq.float()
    out[f"{name}.scalars"] = torch.tensor([float(rotary.attention_scaling), float(attn.scaling)], dtype=torch.float64)


def config(**kw):
    return ds.DeepseekV3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
                               qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, rms_norm_eps=1e-5,
                               max_position_embeddings=64, **kw)


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(39)
    out = {}
    case("lora_interleave", config(q_lora_rank=24, rope_interleave=True,
                                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), g, out)
    case("qproj_yarn", config(q_lora_rank=None, rope_interleave=False,
                              rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                               "original_max_position_embeddings": 16, "mscale": 0.8,
                                               "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}), g, out)
    assert abs(out["qproj_yarn.scalars"][0].item() - 1.0) > 1e-3, "the yarn case must scale cos/sin"
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, "mla.safetensors"))
    meta = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]}
    with open(os.path.join(OUT, "mla.meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
