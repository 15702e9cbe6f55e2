#!/usr/bin/env python3
"""Goldens for the group-limited sigmoid router of DeepSeek-V3 and GLM-4.5 ("noaux_tc"): transformers'
own DeepseekV3TopkRouter and Glm4MoeTopkRouter modules (CPU, fp32), with random router weights and a random
e_score_correction_bias large enough to change the selection, so that a router which ignores the bias, adds
it to the weights too, or skips the group limit picks other experts (the script asserts each of those).

Per case <name>: x [T, H], weight [E, H], bias [E] (the buffer), the config (n_group, topk_group, top_k,
norm_topk_prob, routed_scaling_factor), transformers' logits [T, E], topk_indices [T, k] (int64),
topk_weights [T, k], and for grad_dense [T, E] (an upstream gradient per (token, expert)) the gradients of
sum(grad_dense.gather(1, indices) * weights) with respect to x and the router weight (autograd).

Pinned: torch 2.11.0, transformers 5.23.0 (written to tests/data/models/group_router.meta.json).
Writes tests/data/models/group_router.safetensors.
Run: ~/.cache/axengine/venv/bin/python scripts/goldens/make_group_router_goldens.py
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds
from transformers.models.glm4_moe import modeling_glm4_moe as glm

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "models")


def plain_choice(scores, bias, k):
    return torch.topk(scores + bias, k, dim=-1)[1].sort(-1)[0]


def case(name, router, T, g, out):
    E, H = router.weight.shape
    with torch.no_grad():
        router.weight.copy_(torch.randn(E, H, generator=g) * 0.5)
        # Correction biases of the scores' own size (sigmoid in (0, 1)): they move experts in and out.
        router.e_score_correction_bias.copy_(torch.randn(E, generator=g) * 0.3)
    x = torch.randn(T, H, generator=g).requires_grad_(True)
    logits, weights, indices = router(x)
    grad_dense = torch.randn(T, E, generator=g)
    loss = (grad_dense.gather(1, indices) * weights).sum()
    dx, dw = torch.autograd.grad(loss, [x, router.weight])
    bias = router.e_score_correction_bias
    scores = logits.detach().sigmoid()
    got = indices.sort(-1)[0]
    # The case must tell apart the mistakes a router can make.
    assert not torch.equal(got, plain_choice(scores, torch.zeros_like(bias), router.top_k)), name + ": bias changes nothing"
    if router.topk_group < router.num_group:
        assert not torch.equal(got, plain_choice(scores, bias, router.top_k)), name + ": group limit changes nothing"
    out.update({f"{name}_x": x.detach(), f"{name}_weight": router.weight.detach().clone(), f"{name}_bias": bias.clone(),
                f"{name}_logits": logits.detach(), f"{name}_indices": indices, f"{name}_weights": weights.detach(),
                f"{name}_grad_dense": grad_dense, f"{name}_dx": dx, f"{name}_dweight": dw,
                f"{name}_config": torch.tensor([router.num_group, router.topk_group, router.top_k,
                                                int(router.norm_topk_prob)], dtype=torch.int64),
                f"{name}_scaling": torch.tensor([float(router.routed_scaling_factor)])})


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(39)
    out = {}
    # DeepSeek-V3's shape of routing, small: 32 experts in 8 groups, the 4 best groups, top-8, renormalised, x2.5.
    c = ds.DeepseekV3Config(hidden_size=16, n_routed_experts=32, n_group=8, topk_group=4, num_experts_per_tok=8,
                            norm_topk_prob=True, routed_scaling_factor=2.5)
    case("deepseek_v3", ds.DeepseekV3TopkRouter(c), 24, g, out)
    # GLM-4.5's: one group (no group limit), no renormalisation, scaling 1.5.
    c = glm.Glm4MoeConfig(hidden_size=16, n_routed_experts=12, n_group=1, topk_group=1, num_experts_per_tok=3,
                          norm_topk_prob=False, routed_scaling_factor=1.5)
    case("glm4_moe", glm.Glm4MoeTopkRouter(c), 20, g, out)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, "group_router.safetensors"))
    meta = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]}
    with open(os.path.join(OUT, "group_router.meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
