#!/usr/bin/env python3
"""flash-linear-attention's chunk_gated_delta_rule at gdn_bench's shapes, added to gdn_bench's result file.

    python3 plugins/gdn/bench/fla_bench.py --in gdn-bench.json --out gdn-bench-fla.json [--iters 20]

Reads the rows gdn_bench wrote (shape, seqlens, heads, head dims, dtype), times fla on the same problem the
way transformers' Qwen3-Next / Qwen3.5 layers call it (q/k repeated to the value heads by
repeat_interleave when Hv > Hk, use_qk_l2norm_in_kernel=True, packed rows as one batch with cu_seqlens):
forward alone and forward + backward (the gradients of q, k, v, g, beta), CUDA events, median of --iters
after --warmup. Writes the rows with fla_fwd_ms, fla_step_ms and gdn's step time over fla's, and the
device, date, fla's version and both commands inside the file (docs/performance.md, "Citing results").
Exits 3 when fla is not importable (gpu_job.sh then keeps gdn_bench's file alone).

fla 0.6.0 refuses its gated backward (chunk_bwd_dqkwg) on Hopper with Triton >= 3.4 and < 3.7.1 (fla issue
#640: that Triton miscompiles it, giving wrong dq/dk), and torch 2.11 ships Triton 3.6. For timing only, this
script then lifts the guard in fla's module: the same kernels run, their gradients are not used, and the file
says so ("fla_note", with Triton's version).
"""
import argparse
import datetime
import json
import sys

import torch


def median_ms(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in zip(start, end))
    return ms[iters // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--in", dest="inp", required=True, help="gdn_bench --json output")
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    try:
        import fla
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as e:  # noqa: BLE001 - any import failure means "no fla here"
        print(f"fla_bench: flash-linear-attention is not importable ({e})", file=sys.stderr)
        return 3
    with open(args.inp) as f:
        result = json.load(f)
    import triton
    import fla.ops.common.chunk_o as chunk_o
    if getattr(chunk_o, "IS_NVIDIA_HOPPER", False) and getattr(chunk_o, "TRITON_ABOVE_3_4_0", False) \
            and not getattr(chunk_o, "TRITON_ABOVE_3_7_1", True):
        chunk_o.TRITON_ABOVE_3_7_1 = True
        result["fla_note"] = (f"fla {getattr(fla, '__version__', '?')} refuses its gated backward on Hopper with Triton "
                              f"{triton.__version__} (< 3.7.1; fla issue #640: wrong dq/dk); the guard was lifted for "
                              "timing only: the same kernels ran, their gradients were not used")
        print("fla_bench: " + result["fla_note"], file=sys.stderr)
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    torch.manual_seed(0)
    for row in result["rows"]:
        dt = dtypes[row["dtype"]]
        hk, hv, dk, dv = row["Hk"], row["Hv"], row["Dk"], row["Dv"]
        cu = [0]
        for n in row["seqlens"]:
            cu.append(cu[-1] + n)
        T = cu[-1]
        dev = "cuda"
        q = torch.randn(1, T, hk, dk, device=dev).to(dt).requires_grad_()
        k = torch.randn(1, T, hk, dk, device=dev).to(dt).requires_grad_()
        v = torch.randn(1, T, hv, dv, device=dev).to(dt).requires_grad_()
        g = (-torch.nn.functional.softplus(torch.randn(1, T, hv, device=dev)) * torch.rand(hv, device=dev) * 0.5).requires_grad_()
        beta = torch.sigmoid(torch.randn(1, T, hv, device=dev)).to(dt).requires_grad_()
        cu_seqlens = torch.tensor(cu, dtype=torch.long, device=dev)
        do = torch.randn(1, T, hv, dv, device=dev).to(dt)
        group = hv // hk

        def fwd():
            qq, kk = q, k
            if group > 1:
                qq, kk = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
            o, _ = chunk_gated_delta_rule(qq, kk, v, g=g, beta=beta, initial_state=None, output_final_state=False,
                                          cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=True)
            return o

        def step():
            o = fwd()
            torch.autograd.grad(o, (q, k, v, g, beta), do)

        with torch.no_grad():
            row["fla_fwd_ms"] = median_ms(fwd, args.iters, args.warmup)
        row["fla_step_ms"] = median_ms(step, args.iters, args.warmup)
        row["gdn_step_over_fla_step"] = row["gdn_step_ms"] / row["fla_step_ms"]
        print(f"{row['shape']:<20} fla    {row['fla_fwd_ms']:10.3f} {row['fla_step_ms']:10.3f}", flush=True)
    result["bench"] += "; flash-linear-attention's chunk_gated_delta_rule (fla_*) by plugins/gdn/bench/fla_bench.py"
    result["command"] = result["command"] + " && python3 plugins/gdn/bench/fla_bench.py " + " ".join(sys.argv[1:])
    result["fla_version"] = getattr(fla, "__version__", "unknown")
    result["torch"] = torch.__version__
    result["triton"] = triton.__version__
    result["fla_device"] = torch.cuda.get_device_name()
    result["fla_date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
