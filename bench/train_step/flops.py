"""Matrix FLOPs of one LoRA training step, and the GEMM rate they are divided by for MFU.

The same count serves every row of a bench (axengine and each peer train the same tokens with the same model and
LoRA), so MFU compares like with like. It counts the matrix products a LoRA step needs, not what an
implementation happens to do (HF+peft forms the experts' W + B·A and their full weight gradient; that extra work
is the peer's cost, not the step's). Per step of B rows of S tokens, T = B·S (padding included: both sides run it):

  per decoder layer, for its linear maps x[T, k] -> [T, n] (attention q, k, v, o; dense MLP gate, up, down; MoE
  router, and top_k × the experts' gate_up [k = h, n = 2I] and down [I -> h] per token):
    base forward        2·T·k·n                 frozen weight: backward is dX only,
    base backward       2·T·k·n                 no weight gradient
    LoRA (rank r)       forward 2·T·r·(k + n), backward 2× that (dX through B and A, dA and dB)
                        (MoE experts: gate_up rank 2r, down rank r, as peft converts gate_proj + up_proj)
    attention, per span of L tokens (each sample, and a row's padding span, attends to itself only, causally):
                        forward 2·L²·d·n_heads (QKᵀ and PV, half of the square), backward 2.5× forward
                        (FlashAttention's count: dQ, dK, dV, dP and the recomputed QKᵀ)
  LM head [h -> V]      forward 2·T·h·V, backward 2·T·h·V (dX only)
  activation checkpointing: + one more forward of every decoder layer (base, LoRA, attention), not the LM head.

Norms, RoPE, SwiGLU, softmax and the optimizer are not matrix FLOPs and are left out.
"""
import json
import os
import time


def _layer_linears(cfg, moe):
    """[(name, k, n, lora_rank_key, tokens_per_token)] of one decoder layer: tokens_per_token is top_k for experts."""
    h = cfg["hidden_size"]
    nq, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    d = cfg.get("head_dim") or h // nq
    out = [("q_proj", h, nq * d, 1), ("k_proj", h, nkv * d, 1), ("v_proj", h, nkv * d, 1), ("o_proj", nq * d, h, 1)]
    if moe:
        k, i = cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
        out += [("router", h, cfg["num_experts"], 1), ("gate_up_proj", h, 2 * i, k), ("experts.down_proj", i, h, k)]
    else:
        i = cfg["intermediate_size"]
        out += [("gate_proj", h, i, 1), ("up_proj", h, i, 1), ("down_proj", i, h, 1)]
    return out


def _is_moe_layer(cfg, idx):
    n = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    step = cfg.get("decoder_sparse_step", 1) or 1
    return n > 0 and idx not in (cfg.get("mlp_only_layers") or []) and (idx + 1) % step == 0


def _lora_rank(name, targets, r):
    if name == "gate_up_proj":
        return 2 * r if "gate_proj" in targets and "up_proj" in targets else 0
    if name == "experts.down_proj":
        return r if "down_proj" in targets else 0
    return r if name in targets else 0


def step_flops(model_dir, targets, r, row_spans, checkpointing):
    """The step's matrix FLOPs by part, for a batch whose rows have the attention spans row_spans (a list per
    row of span lengths; packed_rows.spans)."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    cfg = cfg.get("text_config", cfg)
    T = sum(sum(s) for s in row_spans)
    h, V, nq = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"]
    d = cfg.get("head_dim") or h // nq
    base = lora = 0
    for idx in range(cfg["num_hidden_layers"]):
        for name, k, n, per_tok in _layer_linears(cfg, _is_moe_layer(cfg, idx)):
            base += 2 * T * per_tok * k * n
            lora += 2 * T * per_tok * _lora_rank(name, targets, r) * (k + n)
    attn = cfg["num_hidden_layers"] * sum(2 * L * L * d * nq for row in row_spans for L in row)
    head = 2 * T * h * V
    parts = {"base_fwd": base, "base_bwd": base, "lora_fwd": lora, "lora_bwd": 2 * lora, "attention_fwd": attn,
             "attention_bwd": 2.5 * attn, "lm_head_fwd": head, "lm_head_bwd": head,
             "recompute": (base + lora + attn) if checkpointing else 0}
    parts["total"] = sum(parts.values())
    return parts


def gemm_rate(device, dtype, n=None, iters=10):
    """The device's dense GEMM rate in FLOP/s: median of `iters` timed n×n×n torch.matmul (8192 on a GPU; a
    small size on a CPU, where the figure only exercises the code)."""
    import statistics

    import torch
    cuda = device.startswith("cuda")
    n = n or (8192 if cuda else 512)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    times = []
    for i in range(iters + 3):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b)
            end.record()
            end.synchronize()
            dt = start.elapsed_time(end) / 1e3
        else:
            t = time.perf_counter()
            torch.matmul(a, b)
            dt = time.perf_counter() - t
        if i >= 3:
            times.append(dt)
    del a, b
    return {"flops_per_s": 2 * n ** 3 / statistics.median(times), "n": n, "dtype": str(dtype).replace("torch.", ""),
            "iters": iters, "how": "median of torch.matmul n x n x n after 3 warm-up, CUDA events"}
