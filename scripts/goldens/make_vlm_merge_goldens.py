#!/usr/bin/env python3
"""merge-lora goldens for qwen2_5_vl: transformers + peft's merge_and_unload of the committed tiny model and adapter.

Reads tests/data/models/qwen2_5_vl/ (make_vlm_goldens.py: model, adapter/, golden.safetensors with the samples)
and writes tests/data/models/qwen2_5_vl/merged_golden.safetensors:
  logits.k        the merged model's logits on sample k (ids.k, pixel_values.k, grid.k of golden.safetensors)
  metadata "names"  the tensor names save_pretrained writes for the merged model (what `axengine merge-lora`
                  must write so transformers loads it as Qwen2_5_VLForConditionalGeneration), comma separated

tests/unit/model_qwen2_5_vl_test.cpp merges with axengine and compares (fp32, <= 1e-5).

Run with the project venv:  /root/.cache/axengine/venv/bin/python scripts/goldens/make_vlm_merge_goldens.py
"""
import os
import tempfile

import peft
import torch
import transformers
from peft import PeftModel
from safetensors import safe_open
from safetensors.torch import load_file, save_file

DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "models", "qwen2_5_vl")
IMG = 90


def main():
    assert transformers.__version__ == "5.23.0" and peft.__version__ == "0.21.2", "pinned peers expected"
    base = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(DIR, dtype=torch.float32, attn_implementation="eager").eval()
    merged = PeftModel.from_pretrained(base, os.path.join(DIR, "adapter")).merge_and_unload().eval()
    samples = load_file(os.path.join(DIR, "golden.safetensors"))
    out = {}
    with torch.no_grad():
        for k in range(3):
            ids = samples[f"ids.{k}"][None]
            kw = {}
            if f"grid.{k}" in samples:
                kw = dict(pixel_values=samples[f"pixel_values.{k}"], image_grid_thw=samples[f"grid.{k}"],
                          mm_token_type_ids=(ids == IMG).int())
            out[f"logits.{k}"] = merged(input_ids=ids, **kw).logits[0].contiguous()
    with tempfile.TemporaryDirectory() as tmp:
        merged.save_pretrained(tmp)
        with safe_open(os.path.join(tmp, "model.safetensors"), "pt") as f:
            names = sorted(f.keys())
    save_file(out, os.path.join(DIR, "merged_golden.safetensors"), metadata={"names": ",".join(names)})
    print(f"qwen2_5_vl merged: {len(names)} tensors, logits.0 sum {out['logits.0'].sum().item():.6f}")


if __name__ == "__main__":
    main()
