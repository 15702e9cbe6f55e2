#!/usr/bin/env python3
"""Goldens for norm_rope from Hugging Face transformers (CPU, fp32): the q-norm + rotary path of
Qwen3 (RMSNorm with w, full rotary) and Qwen3-Next (RMSNorm with 1 + w, partial rotary 0.25), forward and
backward (autograd), with cos/sin from the models' own rotary-embedding modules.

Writes tests/data/ops/norm_rope.safetensors (small) and tests/data/ops/meta.json.
Run: /root/.cache/axengine/venv/bin/python scripts/goldens/make_op_goldens.py
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers.models.qwen3 import modeling_qwen3 as q3
from transformers.models.qwen3_next import modeling_qwen3_next as q3n

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "ops")


def case(prefix, norm, rotary, apply_rope, B, S, H, D, g, out):
    x = torch.randn(B, S, H, D, generator=g)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(D, generator=g) * 0.3 + (1.0 if prefix == "qwen3" else 0.0))
    pos = torch.randint(0, 4000, (B, S), generator=g)
    cos, sin = rotary(x, pos)  # [B, S, R]
    x_ = x.clone().requires_grad_(True)
    n = norm(x_)  # over the last dim D, x laid out [B, S, H, D]
    y, _ = apply_rope(n, n, cos, sin, unsqueeze_dim=2)
    gy = torch.randn(y.shape, generator=g)
    dx, dw = torch.autograd.grad(y, [x_, norm.weight], gy)
    out.update({f"{prefix}_x": x, f"{prefix}_weight": norm.weight.detach().clone(), f"{prefix}_position_ids": pos,
                f"{prefix}_inv_freq": rotary.inv_freq.float(), f"{prefix}_cos": cos, f"{prefix}_sin": sin,
                f"{prefix}_attention_scaling": torch.tensor([float(rotary.attention_scaling)]),
                f"{prefix}_eps": torch.tensor([float(norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps)]),
                f"{prefix}_y": y.detach(), f"{prefix}_grad_y": gy, f"{prefix}_dx": dx, f"{prefix}_dweight": dw})


def main():
    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(5)
    out = {}
    D, H = 32, 3
    c3 = q3.Qwen3Config(hidden_size=H * D, head_dim=D, num_attention_heads=H, num_key_value_heads=1,
                        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    case("qwen3", q3.Qwen3RMSNorm(D, eps=c3.rms_norm_eps), q3.Qwen3RotaryEmbedding(c3), q3.apply_rotary_pos_emb,
         2, 5, H, D, g, out)
    cn = q3n.Qwen3NextConfig(hidden_size=H * D, head_dim=D, num_attention_heads=H, num_key_value_heads=1,
                             rms_norm_eps=1e-6, partial_rotary_factor=0.25,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                              "partial_rotary_factor": 0.25})
    case("qwen3_next", q3n.Qwen3NextRMSNorm(D, eps=cn.rms_norm_eps), q3n.Qwen3NextRotaryEmbedding(cn),
         q3n.apply_rotary_pos_emb, 2, 5, H, D, g, out)
    assert out["qwen3_next_cos"].shape[-1] == 8, out["qwen3_next_cos"].shape
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, "norm_rope.safetensors"))
    meta = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]}
    with open(os.path.join(OUT, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
