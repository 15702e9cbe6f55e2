#!/usr/bin/env python3
"""Writes a random-init Qwen2.5-VL model dir (bf16 safetensors) of Qwen2.5-VL-3B's shape that axengine and
transformers both load, for the MM-CPT step benchmark (bench/mm_cpt/run.sh).

The config is the `axengine init-model --preset tiny-qwen2_5-vl` one (--tokenizer-from: its token ids, rope
layout and processor files) with the dimensions of Qwen2.5-VL-3B-Instruct: a 36-layer text decoder of hidden
2048 (16/2 heads of 128, intermediate 11008, vocabulary padded to 151,936, tied embeddings) and a 32-block
vision tower of hidden 1280 (16 heads, intermediate 3420, windows of 112 pixels, full attention at blocks
7/15/23/31) merging into 2048. Initialised as make_dense_model.py does: norms 1, embeddings
normal(0, 1/sqrt(hidden)), biases 0, every other weight normal(0, 0.02). Made on the GPU, written once; a dir
holding a complete model (the .complete marker, written last) is reused.

usage: make_vl_model.py --out DIR --tokenizer-from TINY_VL_DIR [--device cuda] [--text-layers 36]
"""
import argparse
import copy
import json
import math
import os
import shutil
import sys

import torch


def init_weights(model, hidden, device, seed):
    """Materialises a meta-device model on `device` and fills it as init-model does: norms 1 (ln_q: the
    Qwen2.5-VL merger's norm), biases 0, embeddings and lm_head normal(0, 1/sqrt(hidden)), the rest normal(0,
    0.02); then ties the head if the config says so. Shared with bench/vlm_sft/make_model.py."""
    model.to_empty(device=device)
    gen = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_q" in name:
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            elif "embed_tokens" in name or name == "lm_head.weight":
                p.normal_(0.0, 1.0 / math.sqrt(hidden), generator=gen)
            else:
                p.normal_(0.0, 0.02, generator=gen)
        model.tie_weights()


def save_model_dir(model, out, tokenizer_from):
    """save_pretrained into OUT.partial with the tokenizer/processor/template files of tokenizer_from, the
    .complete marker last, then renamed to OUT: a dir with the marker holds a whole model."""
    tmp = out.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, max_shard_size="5GB")
    for f in os.listdir(tokenizer_from):
        if f.startswith(("tokenizer", "preprocessor", "generation", "special_tokens", "chat_template")):
            shutil.copy(os.path.join(tokenizer_from, f), tmp)
    open(os.path.join(tmp, ".complete"), "w").close()
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer-from", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--text-layers", type=int, default=36)
    args = ap.parse_args()
    if os.path.exists(os.path.join(args.out, ".complete")):
        print(f"make_vl_model: {args.out} exists, reused")
        return

    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tiny = json.load(open(os.path.join(args.tokenizer_from, "config.json")))
    cfg = copy.deepcopy(tiny)
    n = args.text_layers
    cfg["text_config"].update(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=n,
                              num_attention_heads=16, num_key_value_heads=2, max_window_layers=n,
                              layer_types=["full_attention"] * n, max_position_embeddings=128000)
    cfg["text_config"]["rope_parameters"]["mrope_section"] = [16, 24, 24]
    cfg["vision_config"].update(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                                window_size=112, fullatt_block_indexes=[7, 15, 23, 31])
    cfg["dtype"] = "bfloat16"
    config = Qwen2_5_VLConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(config).to(torch.bfloat16)
    init_weights(model, cfg["text_config"]["hidden_size"], args.device, args.seed)
    save_model_dir(model, args.out, args.tokenizer_from)
    total = sum(p.numel() for p in model.parameters())
    vis = sum(p.numel() for n_, p in model.named_parameters() if "visual" in n_)
    print(f"make_vl_model: wrote a Qwen2.5-VL-3B-shaped model ({total / 1e9:.2f}B parameters, vision {vis / 1e9:.2f}B) to {args.out}")


if __name__ == "__main__":
    sys.exit(main())
