#!/usr/bin/env python3
"""transformers loads what `axengine merge-lora` writes from a pre-quantised (bitsandbytes nf4) base.

For each case of tests/data/bnb/: runs `axengine merge-lora --model CASE --adapter CASE/adapter --out TMP`, loads TMP
with transformers (a dense model: its config must carry no quantization_config) and checks its logits against
golden.safetensors' logits_adapter — what peft computed on the 4-bit base with the adapter
(scripts/goldens/make_bnb_checkpoint_goldens.py).

usage: check_bnb_merge.py AXENGINE_BINARY
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "bnb")
TOL = 1e-4


def main():
    axengine = sys.argv[1]
    failures = 0
    for name in sorted(os.listdir(DATA)):
        case = os.path.join(DATA, name)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "merged")
            subprocess.run([axengine, "merge-lora", "--model", case, "--adapter", os.path.join(case, "adapter"),
                            "--out", out], check=True)
            with open(os.path.join(out, "config.json")) as f:
                assert "quantization_config" not in json.load(f), f"{name}: merged config is still 4-bit"
            m = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
            golden = load_file(os.path.join(case, "golden.safetensors"))
            with torch.no_grad():
                got = m.eval()(input_ids=golden["input_ids"]).logits
            err = (got - golden["logits_adapter"]).abs().max().item()
            ok = err <= TOL
            failures += not ok
            print(f"{name}: merged model in transformers vs peft on the 4-bit base: max |diff| {err:.2e} "
                  f"{'ok' if ok else 'FAIL'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
