#!/usr/bin/env python3
"""Goldens for the quantised weight formats, from the real peers, on CPU.

  nf4   : bitsandbytes.functional.quantize_4bit / dequantize_4bit (quant_type="nf4"), with and without
          compress_statistics (double-quantised absmax), plus bnb's NF4 table and signed dynamic map.
  mxfp4 : torchao.prototype.mx_formats.mx_tensor.to_mx (float4_e2m1fn_x2, block 32, FLOOR) / to_dtype.
  nvfp4 : torchao.prototype.mx_formats.nvfp4_tensor.nvfp4_quantize with per_tensor_amax_to_scale, and
          NVFP4Tensor.dequantize; a 3-dim weight quantised one expert at a time (per-expert global scale).

Writes tests/data/quant/{nf4,mxfp4,nvfp4}.safetensors (a few KB each) and meta.json (peer versions).
Inputs mix random normals with hand-made blocks that hit the edge cases: all-zero blocks, exact E2M1
rounding ties, values that saturate, huge and tiny magnitudes.

Run: /root/.cache/axengine/venv/bin/python scripts/goldens/make_quant_goldens.py
Needs: torch, bitsandbytes, torchao (versions recorded in meta.json).
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

import bitsandbytes
import bitsandbytes.functional as bnbf
import torchao
from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, nvfp4_quantize, per_tensor_amax_to_scale

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "quant")


def nf4_goldens():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(6, 128, generator=g) * 0.05
    w[1, :64] = 0.0                    # an all-zero block
    w[2, 64:] = 0.0
    w[2, 100] = -3.0                   # a block whose absmax is negative
    w[3] *= 40.0                       # a block range far from the others (absmax spread for double quant)
    out = {"nf4_table": bnbf.get_4bit_type("nf4", device="cpu").float(),
           "dynamic_map": bnbf.create_dynamic_map(signed=True).float()}
    # bf16 input too: quantize_4bit reads it as fp32
    w_bf16 = (torch.randn(4, 64, generator=g) * 0.02).to(torch.bfloat16)
    for name, x in (("fp32", w), ("bf16", w_bf16)):
        q, s = bnbf.quantize_4bit(x, blocksize=64, quant_type="nf4", compress_statistics=False)
        out[f"{name}_input"] = x
        out[f"{name}_codes"] = q.reshape(-1).contiguous()
        out[f"{name}_absmax"] = s.absmax.float()
        out[f"{name}_dequant"] = bnbf.dequantize_4bit(q, s).float()
    # double quant: > 256 blocks so that the absmax spans more than one nested block (and a partial one)
    # (bf16 input and output keep the file small; quantisation reads the input as fp32 either way)
    wd = (torch.randn(300, 64, generator=g) * torch.linspace(0.001, 0.2, 300).unsqueeze(1)).to(torch.bfloat16)
    q, s = bnbf.quantize_4bit(wd, blocksize=64, quant_type="nf4", compress_statistics=True)
    out["dq_input"] = wd
    out["dq_codes"] = q.reshape(-1).contiguous()
    out["dq_absmax_codes"] = s.absmax.contiguous()
    out["dq_nested_absmax"] = s.state2.absmax.float()
    out["dq_nested_code"] = s.state2.code.float()
    out["dq_offset"] = s.offset.reshape(1).float()
    out["dq_dequant"] = bnbf.dequantize_4bit(q, s)  # bf16: fp32 math rounded once
    assert s.state2.blocksize == 256
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, "nf4.safetensors"))


def special_block_rows():
    """Rows of 32 values (one mxfp4 block, two nvfp4 blocks) that exercise rounding and saturation."""
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    rows = [
        torch.zeros(32),                                   # all zero
        torch.cat([ties, -ties, ties * 0.5, -ties * 0.5]),  # amax 6 -> exact E2M1 ties at scale 1
        torch.cat([torch.full((31,), 0.1), torch.tensor([7.9])]),  # saturation (7.9 / 2^0 > 6)
        torch.linspace(-1e30, 1e30, 32),                   # huge
        torch.linspace(-1e-38, 1e-38, 32),                 # tiny: the scale clamps to E8M0's bottom
        torch.cat([torch.full((16,), -0.1), torch.full((16,), 3.0)]),  # small negatives round to -0
    ]
    return torch.stack(rows)


def mxfp4_goldens():
    g = torch.Generator().manual_seed(2)
    x = torch.cat([torch.randn(4, 128, generator=g).reshape(-1, 32) * 3.0, special_block_rows()]).reshape(-1, 64)
    out = {}
    for name, inp in (("fp32", x), ("bf16", (torch.randn(4, 64, generator=g)).to(torch.bfloat16))):
        scale, data = to_mx(inp.contiguous(), torch.float4_e2m1fn_x2, 32)
        out[f"{name}_input"] = inp
        out[f"{name}_codes"] = data.view(torch.uint8).contiguous()
        out[f"{name}_scales"] = scale.view(torch.uint8).reshape(inp.shape[0], -1).contiguous()
        out[f"{name}_dequant"] = to_dtype(data, scale, torch.float4_e2m1fn_x2, 32, torch.float32).reshape(inp.shape)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, "mxfp4.safetensors"))


def nvfp4_one(x):
    pts = per_tensor_amax_to_scale(torch.max(torch.abs(x)))
    scales, data = nvfp4_quantize(x.contiguous(), block_size=16, per_tensor_scale=pts)
    t = NVFP4Tensor.to_nvfp4(x.contiguous(), per_tensor_scale=pts)
    assert torch.equal(t.qdata.view(torch.uint8), data.view(torch.uint8))
    return data.view(torch.uint8), scales.view(torch.uint8).reshape(x.shape[0], -1), pts, t.dequantize(torch.float32)


def nvfp4_goldens():
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(4, 64, generator=g).reshape(-1, 32) * 0.3,
                   special_block_rows()[[0, 1, 2, 5]]]).reshape(-1, 64)
    out = {}
    for name, inp in (("fp32", x), ("bf16", (torch.randn(4, 64, generator=g)).to(torch.bfloat16))):
        codes, scales, pts, deq = nvfp4_one(inp)
        out[f"{name}_input"] = inp
        out[f"{name}_codes"] = codes
        out[f"{name}_scales"] = scales
        out[f"{name}_global_scale"] = pts.reshape(())
        out[f"{name}_dequant"] = deq
    # 3-dim weight, one global scale per expert (each expert quantised as its own tensor)
    e = torch.randn(3, 8, 32, generator=g) * torch.tensor([0.01, 1.0, 30.0]).view(3, 1, 1)
    parts = [nvfp4_one(e[i]) for i in range(3)]
    out["experts_input"] = e
    out["experts_codes"] = torch.stack([p[0] for p in parts])
    out["experts_scales"] = torch.stack([p[1] for p in parts])
    out["experts_global_scale"] = torch.stack([p[2].reshape(()) for p in parts])
    out["experts_dequant"] = torch.stack([p[3] for p in parts])
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, "nvfp4.safetensors"))


def main():
    os.makedirs(OUT, exist_ok=True)
    nf4_goldens()
    mxfp4_goldens()
    nvfp4_goldens()
    meta = {"torch": torch.__version__, "bitsandbytes": bitsandbytes.__version__, "torchao": torchao.__version__,
            "python": sys.version.split()[0], "device": "cpu"}
    with open(os.path.join(OUT, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
