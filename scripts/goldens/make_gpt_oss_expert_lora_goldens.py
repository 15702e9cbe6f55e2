#!/usr/bin/env python3
"""gpt-oss expert LoRA goldens: peft's `target_parameters` LoRA on GptOssExperts.gate_up_proj / down_proj, made by
HF transformers + peft on CPU in fp32.

Pinned peers: transformers 5.23.0, peft 0.21.2 (scripts/requirements-goldens.txt).

For the committed tiny gpt_oss model dirs tests/data/models/gpt_oss (dense experts) and gpt_oss_mxfp4 (MXFP4
experts, loaded as transformers dequantises them: Mxfp4Config(dequantize=True)), each gets:
  expert_adapter/                 peft's adapter: attention targets plus target_parameters on both expert
                                  matrices (A seeded, B random so gradients reach every factor), as
                                  save_pretrained writes it
  expert_golden.safetensors       input_ids and labels (those of the case's golden.safetensors), logits, loss,
                                  aux_loss with the adapter, grad.<peft key> of every LoRA factor,
                                  merged_logits and merged.<parameter> (the expert matrices, checkpoint layout
                                  [E, in, out]) of peft's merge_and_unload
The model dirs and their other files are read, never rewritten.

Run with the project venv:
  /root/.cache/axengine/venv/bin/python scripts/goldens/make_gpt_oss_expert_lora_goldens.py
"""
import os
import shutil

import torch
import transformers
import peft
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "models")

CASES = {
    # Both expert matrices (peft nests the ParamWrappers: gate_up_proj's keys gain ".base_layer") and two
    # attention projections.
    "gpt_oss": dict(r=2, alpha=5, rslora=False, targets=["q_proj", "v_proj"],
                    params=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),
    # The packed base: peft's LoRA on transformers' dequantisation of the MXFP4 experts, rsLoRA scaling.
    "gpt_oss_mxfp4": dict(r=3, alpha=4, rslora=True, targets=["o_proj"],
                          params=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),
}


def load_base(d):
    kw = {}
    if "gpt_oss_mxfp4" in d:
        kw["quantization_config"] = transformers.Mxfp4Config(dequantize=True)
    m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, **kw).float().eval()
    m.config._experts_implementation = "eager"
    m.config._attn_implementation = "eager"
    return m


def make_case(name, spec):
    d = os.path.join(OUT, name)
    load_golden = load_file(os.path.join(d, "golden.safetensors"))
    ids, labels = load_golden["input_ids"], load_golden["labels"]
    model = load_base(d)
    torch.manual_seed(99)
    lcfg = LoraConfig(r=spec["r"], lora_alpha=spec["alpha"], use_rslora=spec["rslora"],
                      target_modules=spec["targets"], target_parameters=spec["params"], lora_dropout=0.0)
    pm = get_peft_model(model, lcfg)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(0.3 * torch.randn_like(p))
    ad = os.path.join(d, "expert_adapter")
    shutil.rmtree(ad, ignore_errors=True)
    pm.save_pretrained(ad)

    out = pm(input_ids=ids, labels=labels)
    out.loss.backward()
    golden = {"input_ids": ids, "labels": labels, "logits": out.logits.detach().contiguous(),
              "loss": out.loss.detach().reshape(1), "aux_loss": out.aux_loss.detach().reshape(1)}
    n_grads = 0
    for n, p in pm.named_parameters():
        if p.requires_grad:
            golden["grad." + n.replace(".default", "")] = p.grad.detach().contiguous()
            n_grads += 1
    plain = load_base(d)
    with torch.no_grad():
        plain_logits = plain(input_ids=ids).logits
        assert (plain_logits - out.logits).abs().max() > 1e-3, "the adapter changes the output"
        merged = pm.merge_and_unload().eval()
        merged_logits = merged(input_ids=ids).logits
    golden["merged_logits"] = merged_logits.contiguous()
    for n, p in merged.named_parameters():
        if n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj"):
            golden["merged." + n] = p.detach().contiguous()
    err = (merged_logits - out.logits).abs().max().item()
    assert err < 1e-4, f"{name}: merge_and_unload changes the logits by {err}"
    save_file(golden, os.path.join(d, "expert_golden.safetensors"))
    size = os.path.getsize(os.path.join(d, "expert_golden.safetensors")) + sum(
        os.path.getsize(os.path.join(ad, f)) for f in os.listdir(ad))
    assert size < 200_000, f"{name}: {size} bytes"
    print(f"{name}: loss {out.loss.item():.6f}, {n_grads} LoRA factors, merged logits within {err:.1e}, {size} bytes")


def main():
    assert transformers.__version__ == "5.23.0" and peft.__version__ == "0.21.2", "pinned peers expected"
    for n, spec in CASES.items():
        make_case(n, spec)


if __name__ == "__main__":
    main()
