#!/usr/bin/env python3
"""Greedy-generation goldens with images for the vision-language families' KV-cached decode (`axengine generate` /
`chat` with images), made by HF transformers + peft on CPU in fp32.

For each model dir tests/data/models/<case>/ (qwen2_5_vl, qwen3_vl, qwen3_vl_moe: scripts/goldens/make_vlm_goldens.py; gemma3_mm:
make_gemma3_mm_goldens.py) and each of its golden.safetensors samples (0: two images, 1: one image (qwen3_vl, qwen3_vl_moe: two),
2: text only), model.generate(do_sample=False, max_new_tokens=N) after the sample's tokens with its pixel_values
(and image_grid_thw, mm_token_type_ids for the Qwen VLs: transformers' get_rope_index, then the decode positions
from its rope_deltas; token_type_ids for gemma3: an image's tokens attend each other in the prefill), one sample at
a time (no padding), no eos (every answer is N tokens), without and with the peft adapter. Writes
tests/data/models/<case>/generate_golden.json:
  {"max_new_tokens": N, "tokens": {"base": [[ids] per sample], "adapter": [...]}, "min_margin": m}
min_margin is the smallest gap between the best and the second-best logit over every step: far above fp32
rounding, so an implementation that computes the same function picks the same tokens.

Run with the project venv:  ~/.cache/axengine/venv/bin/python scripts/goldens/make_vlm_generate_goldens.py [CASE...]
(pinned peers: scripts/requirements.txt: transformers 5.23.0, peft 0.21.2)
"""
import json
import os
import sys

import peft
import torch
import transformers
from peft import PeftModel
from safetensors.torch import load_file

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "models")
IMAGE_TOKEN = 90  # every case's image placeholder id
CASES = {
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
    "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",  # qwen3_vl's decode over the MoE decoder, expert adapters
    "gemma3_mm": "Gemma3ForConditionalGeneration",
}
MAX_NEW = 8


def sample_inputs(case, golden, k):
    ids = golden[f"ids.{k}"][None]
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
    if f"pixel_values.{k}" in golden:
        kw["pixel_values"] = golden[f"pixel_values.{k}"]
        if case == "gemma3_mm":
            kw["token_type_ids"] = (ids == IMAGE_TOKEN).long()
        else:
            kw["image_grid_thw"] = golden[f"grid.{k}"]
            kw["mm_token_type_ids"] = (ids == IMAGE_TOKEN).int()
    return kw


def run(case, model, golden):
    gc = model.generation_config
    gc.eos_token_id = None
    gc.pad_token_id = 0
    tokens, margin = [], float("inf")
    for k in range(3):
        kw = sample_inputs(case, golden, k)
        n = kw["input_ids"].shape[1]
        with torch.no_grad():
            out = model.generate(**kw, do_sample=False, max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, output_scores=True,
                                 return_dict_in_generate=True, generation_config=gc)
        for s in out.scores:
            top = torch.topk(s[0].float(), 2).values
            margin = min(margin, float(top[0] - top[1]))
        tokens.append(out.sequences[0, n:].tolist())
    assert all(len(t) == MAX_NEW for t in tokens)
    return tokens, margin


def make(case):
    d = os.path.join(MODELS, case)
    golden = load_file(os.path.join(d, "golden.safetensors"))
    cls = getattr(transformers, CASES[case])
    base = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    base_tokens, m0 = run(case, base, golden)
    lora = PeftModel.from_pretrained(cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager"),
                                     os.path.join(d, "adapter")).eval()
    lora_tokens, m1 = run(case, lora, golden)
    margin = min(m0, m1)
    assert base_tokens != lora_tokens, "the adapter should change the answers"
    with open(os.path.join(d, "generate_golden.json"), "w") as f:
        json.dump(dict(max_new_tokens=MAX_NEW, tokens=dict(base=base_tokens, adapter=lora_tokens), min_margin=margin), f)
        f.write("\n")
    print(f"{case}: min margin {margin:.3g}")
    assert margin > 1e-4, f"{case}: a near tie would make the golden fragile"


def main():
    assert transformers.__version__ == "5.23.0" and peft.__version__ == "0.21.2", "pinned peers expected"
    for case in sys.argv[1:] or list(CASES):
        make(case)


if __name__ == "__main__":
    main()
