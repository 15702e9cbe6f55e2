#!/usr/bin/env python3
"""Writes a random-init dense Qwen3 model dir (bf16 safetensors) that axengine and transformers both load.

`axengine init-model` has no 8B-sized dense preset; the model is made here instead, initialised as init-model
does (core/src/models/tools.cpp): norms 1, embeddings and lm_head normal(0, 1/sqrt(hidden)) so the initial
logits are O(1), every other weight normal(0, 0.02). The tokenizer files come from an init-model dir
(--tokenizer-from): ids 0..~320, all inside the padded 151,936-row vocabulary.

The 8B model is 16 GB: it is made on the GPU (seconds) and written once; a dir that holds a complete model
(the .complete marker, written last) is reused.

usage: make_dense_model.py --out DIR --tokenizer-from INIT_MODEL_DIR [--preset qwen3-8b|tiny] [--device cuda]
"""
import argparse
import json
import math
import os
import shutil
import sys

import torch

PRESETS = {
    # Qwen3-8B's shape (36 layers, hidden 4096, 32/8 heads of 128, intermediate 12288, vocab 151,936).
    "qwen3-8b": dict(num_hidden_layers=36, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=12288, vocab_size=151936, max_position_embeddings=40960),
    # The same code path at a size a CPU test can run.
    "tiny": dict(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128, vocab_size=1024, max_position_embeddings=4096),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer-from", required=True)
    ap.add_argument("--preset", default="qwen3-8b", choices=sorted(PRESETS))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if os.path.exists(os.path.join(args.out, ".complete")):
        print(f"make_dense_model: {args.out} exists, reused")
        return

    from transformers import Qwen3Config, Qwen3ForCausalLM

    gen_cfg = json.load(open(os.path.join(args.tokenizer_from, "generation_config.json")))
    config = Qwen3Config(**PRESETS[args.preset], rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                         bos_token_id=gen_cfg.get("bos_token_id"), eos_token_id=gen_cfg.get("eos_token_id"),
                         pad_token_id=gen_cfg.get("pad_token_id"))
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.to_empty(device=args.device)
    gen = torch.Generator(args.device).manual_seed(args.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif name in ("model.embed_tokens.weight", "lm_head.weight"):
                p.normal_(0.0, 1.0 / math.sqrt(config.hidden_size), generator=gen)
            else:
                p.normal_(0.0, 0.02, generator=gen)

    tmp = args.out.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, max_shard_size="5GB")
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(args.tokenizer_from, f), tmp)
    open(os.path.join(tmp, ".complete"), "w").close()
    shutil.rmtree(args.out, ignore_errors=True)
    os.rename(tmp, args.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"make_dense_model: wrote {args.preset} ({n / 1e9:.2f}B parameters) to {args.out}")


if __name__ == "__main__":
    sys.exit(main())
