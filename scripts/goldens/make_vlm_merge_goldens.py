#!/usr/bin/env python3
"""merge-lora goldens for the vision-language families: transformers + peft's merge_and_unload of the committed
tiny model and adapter.

Reads tests/data/models/<case>/ (make_vlm_goldens.py, make_gemma3_mm_goldens.py: model, adapter/,
golden.safetensors with the samples) and writes tests/data/models/<case>/merged_golden.safetensors:
  logits.k        the merged model's logits on sample k (ids.k and the images of golden.safetensors)
  metadata "names"  the tensor names save_pretrained writes for the merged model (what `axengine merge-lora`
                  must write so transformers loads it as the family's ForConditionalGeneration class), comma separated

tests/unit/model_{qwen2_5_vl,qwen3_vl,qwen3_vl_moe,gemma3_mm}_test.cpp merge with axengine and compare (fp32, <= 1e-5).

Run with the project venv:  ~/.cache/axengine/venv/bin/python scripts/goldens/make_vlm_merge_goldens.py [CASE...]
(default: all four)
"""
import os
import sys
import tempfile

import torch
import transformers
from peft import PeftModel
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from vlm_common import IMG, MODELS, check_pins


def qwen_inputs(samples, k):
    if f"grid.{k}" not in samples:
        return {}
    ids = samples[f"ids.{k}"][None]
    return dict(pixel_values=samples[f"pixel_values.{k}"], image_grid_thw=samples[f"grid.{k}"], mm_token_type_ids=(ids == IMG).int())


def gemma3_inputs(samples, k):
    ids = samples[f"ids.{k}"][None]
    kw = dict(token_type_ids=(ids == IMG).long())  # the image tokens' bidirectional mask
    if f"pixel_values.{k}" in samples:
        kw["pixel_values"] = samples[f"pixel_values.{k}"]
    return kw


CASES = {
    "qwen2_5_vl": (transformers.Qwen2_5_VLForConditionalGeneration, qwen_inputs),
    "qwen3_vl": (transformers.Qwen3VLForConditionalGeneration, qwen_inputs),
    "qwen3_vl_moe": (transformers.Qwen3VLMoeForConditionalGeneration, qwen_inputs),
    "gemma3_mm": (transformers.Gemma3ForConditionalGeneration, gemma3_inputs),
}


def make(case):
    cls, inputs = CASES[case]
    d = os.path.join(MODELS, case)
    base = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    merged = PeftModel.from_pretrained(base, os.path.join(d, "adapter")).merge_and_unload().eval()
    samples = load_file(os.path.join(d, "golden.safetensors"))
    out = {}
    with torch.no_grad():
        for k in range(3):
            out[f"logits.{k}"] = merged(input_ids=samples[f"ids.{k}"][None], **inputs(samples, k)).logits[0].contiguous()
    with tempfile.TemporaryDirectory() as tmp:
        merged.save_pretrained(tmp)
        with safe_open(os.path.join(tmp, "model.safetensors"), "pt") as f:
            names = sorted(f.keys())
    save_file(out, os.path.join(d, "merged_golden.safetensors"), metadata={"names": ",".join(names)})
    print(f"{case} merged: {len(names)} tensors, logits.0 sum {out['logits.0'].sum().item():.6f}")


def main():
    check_pins()
    for case in sys.argv[1:] or list(CASES):
        make(case)


if __name__ == "__main__":
    main()
