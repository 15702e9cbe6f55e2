#!/usr/bin/env python3
"""Greedy-generation goldens for `axengine generate`'s KV-cached decode, made by HF transformers + peft on CPU in
fp32: for each model dir of tests/data/models/<case>/ (scripts/goldens/make_model_goldens.py) with its LoRA
adapter, model.generate(do_sample=False, max_new_tokens=N) after prompts of several lengths, one prompt at a time
(no padding), with no eos (every answer is N tokens). Writes tests/data/models/<case>/generate_golden.json:
  {"max_new_tokens": N, "prompts": [[ids]...], "tokens": [[ids]...], "min_margin": m}
min_margin is the smallest gap between the best and the second-best logit over every step: far above fp32
rounding, so an implementation that computes the same function picks the same tokens.

Run with the project venv:  /root/.cache/axengine/venv/bin/python scripts/goldens/make_generate_goldens.py
(pinned peers: scripts/requirements.txt)
"""
import json
import os
import sys

import torch
import transformers
import peft
from peft import PeftModel

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "models")
# Sliding windows of 3 and 4 (qwen2, mistral, mixtral) and dynamic RoPE's max_position_embeddings 5 (llama_dynamic)
# are all crossed by the longer prompts and answers. qwen3_5: the Gated DeltaNet layers decode from their cached
# recurrent state and conv window (qwen3_5_moe and qwen3_next too, the latter through its fused projections).
CASES = ["llama", "qwen2", "mistral", "qwen3", "qwen3_yarn", "llama_dynamic", "qwen3_moe", "qwen3_moe_top1", "mixtral",
         "gemma3", "olmoe", "gpt_oss", "gpt_oss_mxfp4", "qwen3_5", "qwen3_5_moe", "qwen3_next"]
PROMPT_LENGTHS = [1, 4, 9]
MAX_NEW = 10


def make(name):
    d = os.path.join(DATA, name)
    base = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    base.config._experts_implementation = "eager"
    model = PeftModel.from_pretrained(base, os.path.join(d, "adapter")).eval()
    gc = model.generation_config
    gc.eos_token_id = None
    gc.pad_token_id = 0
    g = torch.Generator().manual_seed(11)
    prompts, tokens, margin = [], [], float("inf")
    for n in PROMPT_LENGTHS:
        ids = torch.randint(0, base.config.vocab_size, (1, n), generator=g)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, output_scores=True,
                                 return_dict_in_generate=True, generation_config=gc)
        for s in out.scores:
            top = torch.topk(s[0].float(), 2).values
            margin = min(margin, float(top[0] - top[1]))
        prompts.append(ids[0].tolist())
        tokens.append(out.sequences[0, n:].tolist())
    assert all(len(t) == MAX_NEW for t in tokens)
    with open(os.path.join(d, "generate_golden.json"), "w") as f:
        json.dump(dict(max_new_tokens=MAX_NEW, prompts=prompts, tokens=tokens, min_margin=margin), f)
        f.write("\n")
    print(f"{name}: min margin {margin:.3g}")
    assert margin > 1e-4, f"{name}: a near tie would make the golden fragile"


def main():
    assert transformers.__version__ == "5.23.0" and peft.__version__ == "0.21.2", "pinned peers expected"
    for n in sys.argv[1:] or CASES:
        make(n)


if __name__ == "__main__":
    main()
