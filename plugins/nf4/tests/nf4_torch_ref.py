"""Shared by the nf4 operator tests: loading the plugin, random nf4 weights, and a direct torch
implementation of bitsandbytes' NF4 dequantisation (and of the QLoRA linear on top of it) that the
operators are checked against. Written from bnb's algorithm, not from axengine's code."""
import os
import sys

import torch

# bitsandbytes functional.get_4bit_type("nf4"), indexed by 4-bit code.
NF4 = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0], dtype=torch.float32)


def load_plugin():
    """torch.ops.load_library on the .so CTest names (AXENGINE_NF4_LIBRARY); exits if it is not set."""
    path = os.environ.get("AXENGINE_NF4_LIBRARY")
    if not path:
        sys.exit("set AXENGINE_NF4_LIBRARY to the built axengine_nf4.so")
    torch.ops.load_library(path)
    return torch.ops.axengine


def cuda_or_skip_reason():
    """None when the CUDA parts can run, else why they are skipped."""
    if not torch.cuda.is_available():
        return "CUDA: no GPU on this machine (the CPU checks above still ran)"
    return None


class Weight:
    """An nf4 weight as bnb's QuantState holds it, as the operators' keyword arguments (kwargs()).
    `double_quant`: absmax stored as uint8 codes into nested_code (bnb compress_statistics=True)."""

    def __init__(self, codes, absmax, shape, blocksize, nested_absmax=None, nested_code=None, offset=0.0,
                 nested_blocksize=256):
        self.codes, self.absmax, self.shape, self.blocksize = codes, absmax, list(shape), blocksize
        self.nested_absmax, self.nested_code = nested_absmax, nested_code
        self.offset, self.nested_blocksize = offset, nested_blocksize

    @staticmethod
    def random(shape, blocksize=64, double_quant=False, nested_blocksize=256, seed=0, device="cpu"):
        """Every field drawn at random (any bytes are valid codes), so every code and nibble is exercised."""
        g = torch.Generator().manual_seed(seed)
        n = 1
        for s in shape:
            n *= s
        nblocks = n // blocksize
        codes = torch.randint(0, 256, (n // 2, 1), dtype=torch.uint8, generator=g)  # bnb's [numel/2, 1]
        if not double_quant:
            absmax = torch.rand(nblocks, generator=g) * 2 + 0.05
            return Weight(codes, absmax, shape, blocksize).to(device)
        absmax = torch.randint(0, 256, (nblocks,), dtype=torch.uint8, generator=g)
        nested_absmax = torch.rand((nblocks + nested_blocksize - 1) // nested_blocksize, generator=g) + 0.5
        nested_code = torch.sort(torch.rand(256, generator=g) * 2 - 1).values
        offset = float(torch.rand((), generator=g)) + 0.25
        return Weight(codes, absmax, shape, blocksize, nested_absmax, nested_code, offset, nested_blocksize).to(device)

    @staticmethod
    def from_bnb(codes, state):
        """From bitsandbytes' quantize_4bit(...) result: the 1:1 mapping of docs/plugins/nf4-python.md."""
        if state.nested:
            return Weight(codes, state.absmax, state.shape, state.blocksize, state.state2.absmax, state.state2.code,
                          state.offset.item(), state.state2.blocksize)
        return Weight(codes, state.absmax, state.shape, state.blocksize)

    def to(self, device):
        move = lambda t: None if t is None else t.to(device)
        return Weight(move(self.codes), move(self.absmax), self.shape, self.blocksize, move(self.nested_absmax),
                      move(self.nested_code), self.offset, self.nested_blocksize)

    def kwargs(self):
        kw = dict(codes=self.codes, absmax=self.absmax, shape=self.shape, blocksize=self.blocksize)
        if self.nested_absmax is not None:
            kw.update(nested_absmax=self.nested_absmax, nested_code=self.nested_code, offset=self.offset,
                      nested_blocksize=self.nested_blocksize)
        return kw

    def args(self):
        """Positional arguments in schema order (opcheck takes positional args)."""
        return (self.codes, self.absmax, self.shape, self.blocksize)

    def nested_args(self):
        return (self.nested_absmax, self.nested_code, self.offset, self.nested_blocksize)


def ref_dequantize(w, dtype):
    """bnb's dequantize_4bit, written out: element i has code (byte >> 4) for even i, (byte & 15) for odd i,
    and value NF4[code] * absmax[i // blocksize], in fp32, rounded once to dtype. Double quant first
    recovers absmax = nested_code[absmax_code] * nested_absmax[b // nested_blocksize] + offset (fp32)."""
    dev = w.codes.device
    c = w.codes.reshape(-1).to(torch.int64)
    idx = torch.stack([(c >> 4) & 15, c & 15], dim=1).reshape(-1)
    if w.nested_absmax is not None:
        nb = w.absmax.numel()
        scale2 = w.nested_absmax.repeat_interleave(w.nested_blocksize)[:nb]
        absmax = w.nested_code[w.absmax.to(torch.int64)] * scale2 + w.offset
    else:
        absmax = w.absmax
    vals = NF4.to(dev)[idx] * absmax.to(torch.float32).repeat_interleave(w.blocksize)
    return vals.reshape(w.shape).to(dtype)


def ref_linear(x, w, bias=None, lora_a=None, lora_b=None, scaling=1.0):
    """The QLoRA linear in plain torch (differentiable in x, bias, lora_a, lora_b)."""
    y = torch.nn.functional.linear(x, ref_dequantize(w, x.dtype), bias)
    if lora_a is not None:
        y = y + scaling * ((x @ lora_a.t()) @ lora_b.t())
    return y
