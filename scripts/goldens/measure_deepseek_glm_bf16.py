#!/usr/bin/env python3
"""transformers 5.23 + peft 0.21.2's own bf16 run of the glm4_moe / deepseek_v3 parity cases against their fp32
goldens (tests/data/models/<case>, scripts/goldens/make_deepseek_glm_goldens.py), in the measures of
tests/unit/model_deepseek_glm_test.cpp's bf16 case (which cites these numbers beside ours): logits max |diff| /
max(1, max |logit|), loss relative, LoRA gradients norm-relative (worst factor). bf16 base and activations, fp32
LoRA factors, as axengine runs bf16. Measures only; writes nothing.

Run from the repository root with the project venv:
  ~/.cache/axengine/venv/bin/python scripts/goldens/measure_deepseek_glm_bf16.py
"""
import torch
import transformers
from peft import PeftModel
from safetensors.torch import load_file
assert transformers.__version__ == "5.23.0", "pinned peer expected"
for name in ["glm4_moe", "glm4_moe_qknorm", "deepseek_v3", "deepseek_v3_qproj"]:
    d = f"tests/data/models/{name}"
    g = load_file(f"{d}/golden.safetensors")
    m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    m.config._experts_implementation = "eager"
    m = PeftModel.from_pretrained(m, f"{d}/adapter", is_trainable=True)
    for n, p in m.named_parameters():
        if "lora_" in n: p.data = p.data.float()
    out = m(input_ids=g["input_ids"], labels=g["labels"])
    want = g["logits"]
    le = (out.logits.float() - want).abs().max().item() / max(1.0, want.abs().max().item())
    lo = abs(out.loss.item() - g["loss"].item()) / abs(g["loss"].item())
    out.loss.backward()
    ge = 0; worst = ""
    for n, p in m.named_parameters():
        if "lora_" not in n or p.grad is None: continue
        key = "grad." + n.replace(".default", "")
        if key not in g: continue
        w = g[key]; e = ((p.grad.float() - w).norm() / w.norm()).item()
        if e > ge: ge, worst = e, n
    print(f"{name}: transformers bf16 logits {le:.4f} loss {lo:.5f} grads {ge:.4f} ({worst})")
