#!/usr/bin/env python3
"""transformers loads what `axengine merge-lora` writes for the vision-language families.

For each case (tests/data/models/qwen2_5_vl, qwen3_vl, qwen3_vl_moe, gemma3_mm): runs `axengine merge-lora --model CASE --adapter
CASE/adapter --out TMP`, loads TMP with the family's ForConditionalGeneration class (every tensor found, none left
over) and checks its logits on the golden samples against merged_golden.safetensors: what peft's merge_and_unload
gave (scripts/goldens/make_vlm_merge_goldens.py), fp32, <= 1e-5.

usage: check_vlm_merge.py AXENGINE_BINARY
"""
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "goldens"))
from make_vlm_merge_goldens import CASES  # noqa: E402  the classes and sample inputs the goldens were made with
from vlm_common import MODELS  # noqa: E402

TOL = 1e-5


def main():
    axengine = sys.argv[1]
    failures = 0
    for name, (cls, inputs) in CASES.items():
        case = os.path.join(MODELS, name)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "merged")
            subprocess.run([axengine, "merge-lora", "--model", case, "--adapter", os.path.join(case, "adapter"), "--out", out],
                           check=True)
            m, info = cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
            missing = [k for k in info["missing_keys"] if "lm_head" not in k]  # a tied head is not stored
            assert not missing and not info["unexpected_keys"], f"{name}: missing {missing}, unexpected {info['unexpected_keys']}"
            samples = load_file(os.path.join(case, "golden.safetensors"))
            golden = load_file(os.path.join(case, "merged_golden.safetensors"))
            err = 0.0
            with torch.no_grad():
                for k in range(3):
                    got = m.eval()(input_ids=samples[f"ids.{k}"][None], **inputs(samples, k)).logits[0]
                    err = max(err, (got - golden[f"logits.{k}"]).abs().max().item())
            ok = err <= TOL
            failures += not ok
            print(f"{name}: merged model in transformers vs peft's merge_and_unload: max |diff| {err:.2e} {'ok' if ok else 'FAIL'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
