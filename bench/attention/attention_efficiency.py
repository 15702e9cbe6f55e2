#!/usr/bin/env python3
"""How close the `attention` op's aten backend gets to what the GPU can do (issue 17, attention item).

The aten backend is LibTorch's varlen FlashAttention-2: it calls exactly `aten::_flash_attention_forward` /
`_flash_attention_backward` with cu_seqlens (core/src/ops/aten/attention.cpp). This script times those two calls on
the training shapes, and against them:
  - cuDNN's fused attention (`aten::_scaled_dot_product_cudnn_attention`, forward + backward), on the same tokens
    laid out as a dense batch, where the packing allows it (equal lengths): the other fused kernel LibTorch has;
  - a bf16 GEMM (8192^3, cuBLAS): the tensor-core rate the GPU sustains, the "attainable" FLOP/s.
FLOPs count only the causal half (what the kernels compute): forward 4·Hq·D·Σ L(L+1)/2, backward 2.5× that.
Times: CUDA events, median of --iters after --warmup. Prints one JSON object.

usage: attention_efficiency.py [--iters 30] [--warmup 5]
"""
import argparse
import json
import statistics

import torch

A = torch.ops.aten


def median_ms(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def causal_flops(lengths, hq, d):
    fwd = 4 * hq * d * sum(l * (l + 1) // 2 for l in lengths)
    return fwd, 2.5 * fwd


def flash_case(lengths, hq, hkv, d, iters, warmup):
    T = sum(lengths)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(T, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(T, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(T, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device="cuda", dtype=torch.int32)
    L = max(max(lengths), 2)
    scale = d ** -0.5

    def fwd():
        return A._flash_attention_forward(q, k, v, cu, cu, L, L, 0.0, True, False, scale=scale)

    out, lse, seed, offset, _ = fwd()
    dout = torch.randn_like(out)

    def bwd():
        return A._flash_attention_backward(dout, q, k, v, out, lse, cu, cu, L, L, 0.0, True, seed, offset, scale=scale)

    return median_ms(fwd, iters, warmup), median_ms(bwd, iters, warmup)


def cudnn_case(lengths, hq, hkv, d, iters, warmup):
    if len(set(lengths)) != 1:
        return None  # cuDNN's dense form needs one length; the ragged (nested) form is not in this LibTorch's ops
    B, S = len(lengths), lengths[0]
    g = torch.Generator(device="cuda").manual_seed(0)
    # cuDNN SDPA wants equal head counts here: K/V repeated for GQA (flash reads them unrepeated).
    q = torch.randn(B, hq, S, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, hkv, S, d, device="cuda", dtype=torch.bfloat16, generator=g).repeat_interleave(hq // hkv, 1)
    v = torch.randn(B, hkv, S, d, device="cuda", dtype=torch.bfloat16, generator=g).repeat_interleave(hq // hkv, 1)
    scale = d ** -0.5
    try:
        def fwd():
            return A._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False, scale=scale)

        res = fwd()
        out, lse = res[0], res[1]
        cq, ck, seed, offset = res[2], res[3], res[6], res[7]
        dout = torch.randn_like(out)

        def bwd():
            return A._scaled_dot_product_cudnn_attention_backward(dout, q, k, v, out, lse, seed, offset, None, cq, ck,
                                                                   S, S, 0.0, True, scale=scale)

        return median_ms(fwd, iters, warmup), median_ms(bwd, iters, warmup)
    except Exception as e:  # an unsupported shape on this build: reported, not hidden
        return {"error": str(e).splitlines()[0][:200]}


def gemm_tflops(iters, warmup):
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = median_ms(lambda: a @ b, iters, warmup)
    return 2 * n ** 3 / ms / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    peak = gemm_tflops(args.iters, args.warmup)
    # bench/train_step's shapes: the MoE model (16/4 heads, head_dim 64, 2x2048 tokens) and the dense Qwen3-8B
    # shape (32/8 heads, head_dim 128, 1x2048); packed rows of many short samples and of a few long ones.
    short, cycle = [], [64, 96, 128, 160, 192, 256, 320, 384, 448, 512, 224]
    while sum(short) + cycle[len(short) % len(cycle)] < 4096:
        short.append(cycle[len(short) % len(cycle)])
    short.append(4096 - sum(short))  # 4096 tokens in all, lengths 64..512 as instruction data packs
    cases = [
        ("moe h64: 2x2048", [2048, 2048], 16, 4, 64),
        ("moe h64: 4096 of many short samples", short, 16, 4, 64),
        ("dense h128: 1x2048", [2048], 32, 8, 128),
        ("dense h128: 2x4096", [4096, 4096], 32, 8, 128),
        ("dense h128: 4096 of many short samples", short, 32, 8, 128),
        ("dense h128: 1x8192", [8192], 32, 8, 128),
    ]
    rows = []
    for name, lengths, hq, hkv, d in cases:
        ff, fb = causal_flops(lengths, hq, d)
        f_ms, b_ms = flash_case(lengths, hq, hkv, d, args.iters, args.warmup)
        row = dict(case=name, samples=len(lengths), tokens=sum(lengths), hq=hq, hkv=hkv, head_dim=d,
                   flash_fwd_ms=round(f_ms, 4), flash_bwd_ms=round(b_ms, 4),
                   flash_fwd_tflops=round(ff / f_ms / 1e9, 1), flash_bwd_tflops=round(fb / b_ms / 1e9, 1),
                   flash_fwd_bwd_of_gemm=round((ff + fb) / (f_ms + b_ms) / 1e9 / peak, 3))
        c = cudnn_case(lengths, hq, hkv, d, args.iters, args.warmup)
        if isinstance(c, tuple):
            row.update(cudnn_fwd_ms=round(c[0], 4), cudnn_bwd_ms=round(c[1], 4),
                       cudnn_fwd_bwd_of_gemm=round((ff + fb) / (c[0] + c[1]) / 1e9 / peak, 3),
                       flash_over_cudnn_time=round((f_ms + b_ms) / (c[0] + c[1]), 3))
        elif c is not None:
            row.update(cudnn=c)
        rows.append(row)
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                          gemm_bf16_tflops=round(peak, 1), cases=rows), indent=1))


if __name__ == "__main__":
    main()
