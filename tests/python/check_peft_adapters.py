#!/usr/bin/env python3
"""HF peft / transformers load what axengine writes.

1. Runs the axengine_tests case "peft export*" with AXENGINE_PEFT_EXPORT_DIR set: for every model family it
   writes a LoRA adapter (PEFT format), the logits axengine computes with it, and a merged model dir.
2. Loads each base model with transformers, the adapter with peft.PeftModel.from_pretrained, and checks the
   logits match axengine's; loads the merged dir with transformers and checks the same logits.
3. Runs `axengine init-model` for every preset and loads the result with transformers (model + tokenizer).

usage: check_peft_adapters.py AXENGINE_TESTS_BINARY AXENGINE_BINARY
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


def load_base(path):
    m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    m.config._experts_implementation = "eager"
    return m.eval()


def main():
    tests_bin, axengine_bin = sys.argv[1], sys.argv[2]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, AXENGINE_PEFT_EXPORT_DIR=tmp)
        subprocess.run([tests_bin, "-tc=peft export*"], env=env, check=True)
        cases = sorted(os.listdir(tmp))
        assert cases, "axengine wrote no cases"
        for case in cases:
            d = os.path.join(tmp, case)
            base_dir = open(os.path.join(d, "base_dir.txt")).read().strip()
            expected = load_file(os.path.join(d, "expected.safetensors"))
            ids, want = expected["input_ids"], expected["logits"]
            scale = max(1.0, want.abs().max().item())
            model = PeftModel.from_pretrained(load_base(base_dir), os.path.join(d, "adapter")).eval()
            with torch.no_grad():
                got = model(input_ids=ids).logits
            err = (got - want).abs().max().item() / scale
            print(f"{case}: peft adapter logits rel err {err:.2e}")
            if not err <= TOL:
                failures.append(f"{case}: peft logits differ by {err}")
            merged = load_base(os.path.join(d, "merged"))
            with torch.no_grad():
                got = merged(input_ids=ids).logits
            err = (got - want).abs().max().item() / scale
            print(f"{case}: merged model logits rel err {err:.2e}")
            if not err <= TOL:
                failures.append(f"{case}: merged logits differ by {err}")
        for preset in ["tiny-llama", "tiny-qwen3", "tiny-qwen3-moe", "tiny-mixtral"]:
            out = os.path.join(tmp, "init-" + preset)
            subprocess.run([axengine_bin, "init-model", "--preset", preset, "--out", out, "--seed", "3"], check=True)
            m = load_base(out)
            tok = transformers.AutoTokenizer.from_pretrained(out)
            ids = tok("hello world, the quick brown fox", return_tensors="pt").input_ids
            with torch.no_grad():
                logits = m(input_ids=ids).logits
            if not torch.isfinite(logits).all() or logits.shape[-1] != m.config.vocab_size:
                failures.append(f"{preset}: bad logits from the init-model dir")
            # Every tensor in the checkpoint is one transformers expects (no unused / missing weights).
            _, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
            if any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")):
                failures.append(f"{preset}: loading info {info}")
            print(f"{preset}: loads in transformers ({sum(p.numel() for p in m.parameters())} params)")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
