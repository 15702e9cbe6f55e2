#!/usr/bin/env python3
"""Goldens for linear_attention and causal_conv1d (and the gated RMSNorm they feed) from Hugging Face
transformers' torch fallbacks of the Gated DeltaNet layer (models/qwen3_next: the same functions as
qwen3_5), CPU, fp32 unless named otherwise:

  chunk_*       torch_chunk_gated_delta_rule: 2 sequences of 90 rows (a chunk boundary, not a multiple of 64),
                Hk=2, Hv=4 (value heads share key heads), q/k L2-normalised inside, an initial state, the final
                state; gradients (autograd) of q, k, v, g, beta and the initial state for random grad_out and
                grad_final_state
  recur_*       torch_recurrent_gated_delta_rule: 1 sequence of 37 rows, Hk=Hv=3, no L2 norm (k unit-norm)
  decode_*      one torch_recurrent_gated_delta_rule step per sequence from chunk_'s final state
  conv_*        causal_conv1d_fn (SiLU, kernel 4) over 2 sequences of 9 rows, gradient of x; the cache's conv
                state after that prefill (LinearAttentionLayer.update_conv_state) and one causal_conv1d_update
                decode step from it
  gnorm_*       Qwen3NextRMSNormGated, fp32 (with gradients of x and z) and bf16

g is made as the layers make it, -exp(A_log) * softplus(a + dt_bias), and beta = sigmoid(b).
Writes tests/data/ops/linear_attention.safetensors and tests/data/ops/linear_attention.meta.json.
Run: ~/.cache/axengine/venv/bin/python scripts/goldens/make_linear_attention_goldens.py
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers.cache_utils import LinearAttentionLayer
from transformers.models.qwen3_next import modeling_qwen3_next as q3n

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "ops")


def decay(B, S, Hv, g):
    A_log = torch.log(torch.empty(Hv).uniform_(0.02, 1.0, generator=g))
    a = torch.randn(B, S, Hv, generator=g)
    dt_bias = torch.randn(Hv, generator=g) * 0.5
    return -A_log.float().exp() * F.softplus(a.float() + dt_bias)


def delta_rule(fn, out, prefix, g, B, S, Hk, Hv, Dk, Dv, l2, with_state):
    q = torch.randn(B, S, Hk, Dk, generator=g)
    k = torch.randn(B, S, Hk, Dk, generator=g)
    if not l2:
        k = F.normalize(k, dim=-1)
    v = torch.randn(B, S, Hv, Dv, generator=g)
    gd = decay(B, S, Hv, g)
    beta = torch.randn(B, S, Hv, generator=g).sigmoid()
    h0 = torch.randn(B, Hv, Dk, Dv, generator=g) * 0.5 if with_state else None
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, gd, beta)]
    h0_ = h0.clone().requires_grad_(True) if with_state else None
    o, ht = fn(*leaves[:3], g=leaves[3], beta=leaves[4], initial_state=h0_, output_final_state=with_state,
               use_qk_l2norm_in_kernel=l2)
    go = torch.randn(o.shape, generator=g)
    outs, grads_in = [o], [go]
    if with_state:
        gh = torch.randn(ht.shape, generator=g) * 0.5
        outs.append(ht)
        grads_in.append(gh)
        out[f"{prefix}_grad_final_state"] = gh
        out[f"{prefix}_initial_state"] = h0
        out[f"{prefix}_final_state"] = ht.detach()
    wrt = leaves + ([h0_] if with_state else [])
    grads = torch.autograd.grad(outs, wrt, grads_in)
    for name, t in zip(("q", "k", "v", "g", "beta"), (q, k, v, gd, beta)):
        out[f"{prefix}_{name}"] = t
    out[f"{prefix}_out"] = o.detach()
    out[f"{prefix}_grad_out"] = go
    for name, t in zip(("dq", "dk", "dv", "dg", "dbeta", "dinitial_state"), grads):
        out[f"{prefix}_{name}"] = t
    return q, k, v, gd, beta, ht


def main():
    assert transformers.__version__ == "5.23.0" and torch.__version__.startswith("2.11.0"), "pinned peers expected"
    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(38)
    out = {}

    # The chunked form (what training runs), then one decode step per sequence from its final state.
    B, S, Hk, Hv, Dk, Dv = 2, 90, 2, 4, 16, 8
    *_, ht = delta_rule(q3n.torch_chunk_gated_delta_rule, out, "chunk", g, B, S, Hk, Hv, Dk, Dv, True, True)
    q1, k1 = torch.randn(B, 1, Hk, Dk, generator=g), torch.randn(B, 1, Hk, Dk, generator=g)
    v1 = torch.randn(B, 1, Hv, Dv, generator=g)
    g1, b1 = decay(B, 1, Hv, g), torch.randn(B, 1, Hv, generator=g).sigmoid()
    with torch.no_grad():
        o1, h1 = q3n.torch_recurrent_gated_delta_rule(q1, k1, v1, g=g1, beta=b1, initial_state=ht.detach(),
                                                      output_final_state=True, use_qk_l2norm_in_kernel=True)
    out.update({"decode_q": q1, "decode_k": k1, "decode_v": v1, "decode_g": g1, "decode_beta": b1,
                "decode_out": o1, "decode_final_state": h1})
    # The recurrent form (transformers' single-token path), no norm inside, Hv = Hk.
    delta_rule(q3n.torch_recurrent_gated_delta_rule, out, "recur", g, 1, 37, 3, 3, 8, 8, False, False)

    # The causal conv1d with SiLU over [B, C, S], the cache's conv state, and one decode step.
    C, W, S = 12, 4, 9
    x = torch.randn(B, C, S, generator=g)
    w = torch.randn(C, W, generator=g) * 0.5
    x_ = x.clone().requires_grad_(True)
    y = q3n.causal_conv1d_fn(x_, w, None, activation="silu")
    gy = torch.randn(y.shape, generator=g)
    (dx,) = torch.autograd.grad(y, [x_], gy)
    layer = LinearAttentionLayer()
    layer.update_conv_state(x, conv_kernel_size=W)  # prefill: keeps the last W inputs
    conv_state = layer.conv_states[0].clone()
    x1 = torch.randn(B, C, 1, generator=g)
    y1 = q3n.causal_conv1d_update(x1, conv_state.clone(), w, None, "silu")
    out.update({"conv_x": x, "conv_weight": w, "conv_y": y.detach(), "conv_grad_y": gy, "conv_dx": dx,
                "conv_cache_state": conv_state, "conv_decode_x": x1, "conv_decode_y": y1})

    # The gated RMSNorm the layer ends with: norm(o)·silu(z).
    rows, D = 10, 24
    norm = q3n.Qwen3NextRMSNormGated(D, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(D, generator=g) * 0.3 + 1.0)
    o = torch.randn(rows, D, generator=g) * 2.0
    z = torch.randn(rows, D, generator=g) * 2.0
    o_, z_ = o.clone().requires_grad_(True), z.clone().requires_grad_(True)
    y = norm(o_, z_)
    gy = torch.randn(y.shape, generator=g)
    do, dz = torch.autograd.grad(y, [o_, z_], gy)
    out.update({"gnorm_x": o, "gnorm_z": z, "gnorm_weight": norm.weight.detach().clone(), "gnorm_y": y.detach(),
                "gnorm_grad_y": gy, "gnorm_dx": do, "gnorm_dz": dz,
                "gnorm_eps": torch.tensor([float(norm.variance_epsilon)])})
    norm16 = q3n.Qwen3NextRMSNormGated(D, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        norm16.weight.copy_(norm.weight.to(torch.bfloat16))
        y16 = norm16(o.to(torch.bfloat16), z.to(torch.bfloat16))
    out["gnorm_y_bf16"] = y16

    total = sum(t.numel() * t.element_size() for t in out.values())
    assert total < 300_000, f"{total} bytes"
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, "linear_attention.safetensors"))
    meta = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]}
    with open(os.path.join(OUT, "linear_attention.meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
