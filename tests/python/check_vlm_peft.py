#!/usr/bin/env python3
"""HF peft loads the qwen2_5_vl / qwen3_vl / qwen3_vl_moe LoRA adapters axengine writes, with the same logits on image+text samples.

Runs the axengine_tests case "<family>: adapters we save*" with AXENGINE_VLM_PEFT_EXPORT_DIR set: it writes
adapter/ (trained-looking: B random), expected.safetensors (per sample: ids, pixel_values and grid where it
has images, and axengine's logits from a packed batch) and base_dir.txt. Here transformers loads the base
(Qwen2_5_VL- / Qwen3VL- / Qwen3VLMoeForConditionalGeneration), peft the adapter, and each sample runs alone.

usage: check_vlm_peft.py AXENGINE_TESTS_BINARY [FAMILY]   (FAMILY: qwen2_5_vl, the default, qwen3_vl
or qwen3_vl_moe)
"""
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from peft import PeftModel
from safetensors.torch import load_file

TOL = 1e-4
MODEL_CLASS = {"qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration", "qwen3_vl": "Qwen3VLForConditionalGeneration",
               "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration"}


def main():
    tests_bin = sys.argv[1]
    family = sys.argv[2] if len(sys.argv) > 2 else "qwen2_5_vl"
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, AXENGINE_VLM_PEFT_EXPORT_DIR=tmp)
        subprocess.run([tests_bin, f"-tc={family}: adapters we save*"], env=env, check=True)
        base_dir = open(os.path.join(tmp, "base_dir.txt")).read().strip()
        expected = load_file(os.path.join(tmp, "expected.safetensors"))
        base = getattr(transformers, MODEL_CLASS[family]).from_pretrained(base_dir, dtype=torch.float32).eval()
        image_token = base.config.image_token_id
        model = PeftModel.from_pretrained(base, os.path.join(tmp, "adapter")).eval()
        assert not any("visual" in n for n, _ in model.named_modules() if n.endswith("lora_A")), "LoRA on the vision tower"
        worst, k = 0.0, 0
        while f"ids.{k}" in expected:
            ids = expected[f"ids.{k}"][None]
            kw = {}
            if f"grid.{k}" in expected:
                kw = dict(pixel_values=expected[f"pixel_values.{k}"], image_grid_thw=expected[f"grid.{k}"],
                          mm_token_type_ids=(ids == image_token).int())
            with torch.no_grad():
                got = model(input_ids=ids, **kw).logits[0]
            want = expected[f"logits.{k}"]
            err = (got - want).abs().max().item() / max(1.0, want.abs().max().item())
            print(f"sample {k}: peft logits rel err {err:.2e}")
            worst = max(worst, err)
            k += 1
        assert k == 3, f"expected 3 samples, got {k}"
    if not worst <= TOL:
        print(f"FAILED: peft logits differ by {worst}")
        sys.exit(1)


if __name__ == "__main__":
    main()
