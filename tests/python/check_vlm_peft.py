#!/usr/bin/env python3
"""HF peft loads the qwen2_5_vl / qwen3_vl / qwen3_vl_moe / gemma3 LoRA adapters axengine writes, with the same
logits on image+text samples, wrapping exactly the modules the adapter holds.

Runs the axengine_tests case "<family>: adapters we save*" (or CASE) with AXENGINE_VLM_PEFT_EXPORT_DIR set: it
writes adapter/ (trained-looking: B random), expected.safetensors (per sample: ids, pixel_values and grid where it
has images, and axengine's logits from a packed batch) and base_dir.txt. Here transformers loads the base
(Qwen2_5_VL- / Qwen3VL- / Qwen3VLMoe- / Gemma3ForConditionalGeneration), peft the adapter, and each sample runs
alone. The modules peft wraps must be those whose tensors the adapter holds: the language model's, and the
vision side's when the adapter has some (lora.vision_targets), nothing more.

usage: check_vlm_peft.py AXENGINE_TESTS_BINARY [FAMILY [CASE]]   (FAMILY: qwen2_5_vl, the default, qwen3_vl,
qwen3_vl_moe or gemma3_mm)
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
               "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration", "gemma3_mm": "Gemma3ForConditionalGeneration"}


def main():
    tests_bin = sys.argv[1]
    family = sys.argv[2] if len(sys.argv) > 2 else "qwen2_5_vl"
    case = sys.argv[3] if len(sys.argv) > 3 else f"{family}: adapters we save*"
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, AXENGINE_VLM_PEFT_EXPORT_DIR=tmp)
        subprocess.run([tests_bin, f"-tc={case}"], env=env, check=True)
        base_dir = open(os.path.join(tmp, "base_dir.txt")).read().strip()
        expected = load_file(os.path.join(tmp, "expected.safetensors"))
        base = getattr(transformers, MODEL_CLASS[family]).from_pretrained(base_dir, dtype=torch.float32).eval()
        image_token = base.config.image_token_id
        model = PeftModel.from_pretrained(base, os.path.join(tmp, "adapter")).eval()
        prefix = "base_model.model."
        ours = {k[len(prefix):].rsplit(".lora_A", 1)[0]
                for k in load_file(os.path.join(tmp, "adapter", "adapter_model.safetensors")) if ".lora_A" in k}
        theirs = {n[len(prefix):] for n, m in model.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A}
        assert ours == theirs, f"peft wraps {sorted(theirs - ours)} beyond the adapter's modules, misses {sorted(ours - theirs)}"
        worst, k = 0.0, 0
        while f"ids.{k}" in expected:
            ids = expected[f"ids.{k}"][None]
            kw = {}
            if f"grid.{k}" in expected:
                kw = dict(pixel_values=expected[f"pixel_values.{k}"], image_grid_thw=expected[f"grid.{k}"],
                          mm_token_type_ids=(ids == image_token).int())
            elif f"pixel_values.{k}" in expected:  # gemma3: the tokens of one image see each other
                kw = dict(pixel_values=expected[f"pixel_values.{k}"], token_type_ids=(ids == image_token).long())
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
