#!/usr/bin/env python3
"""Writes a random-init Qwen3-VL model dir (bf16 safetensors, transformers 5's module tree) that axengine and
transformers both load, for the VLM SFT step benchmark (bench/vlm_sft/run.sh).

The config starts from the `axengine init-model --preset tiny-qwen3-vl` dir (--tokenizer-from: its tokenizer,
token ids and rope layout) and takes the shape of --preset:

  qwen3-vl-8b  Qwen/Qwen3-VL-8B-Instruct's shape. Where each number comes from:
    vision tower: depth 27, hidden 1152, 16 heads, intermediate 4304, patch 16, temporal patch 2, spatial
      merge 2, a 48 x 48 position table (2304), deepstack_visual_indexes [8, 16, 24], gelu_pytorch_tanh: the
      defaults of transformers 5.23's Qwen3VLVisionConfig (configuration_qwen3_vl.py), which are the 8B's;
      out_hidden_size = the text hidden size (4096; the class default, 3584, is another model's).
    text decoder: hidden 4096, 36 layers, 32 query / 8 key-value heads of 128, intermediate 12288, vocabulary
      151,936 (the tokenizer's ids all fall inside it), rms_norm_eps 1e-6, rope_theta 5e6, mrope_section
      [24, 20, 20] interleaved, untied head: the hub's config.json of Qwen/Qwen3-VL-8B-Instruct (text_config).
      Qwen3VLTextConfig's own defaults are another shape (32 layers, 32 key-value heads, intermediate 22016),
      so these are set explicitly; the decoder is Qwen3-8B's (bench/train_step/make_dense_model.py, qwen3-8b).
    preprocessor_config.json: the hub's (Qwen2VLImageProcessorFast: patch 16, merge 2, mean / std 0.5,
      shortest_edge 65,536 and longest_edge 16,777,216 pixels), so a 1024 x 768 photo is 768 image tokens.
  tiny         the tiny-qwen3-vl preset's own shape and processor bounds (4 to 64 merged tokens per image): the
               same code path at a size a CPU test runs (TINY=1).

Both get Qwen3-VL-8B-Instruct's chat template (tests/data/chat_templates/Qwen-Qwen3-VL-8B-Instruct.jinja) as
chat_template.jinja, which axengine's chat_template rows and transformers' processor both render with.
Initialised as bench/mm_cpt/make_vl_model.py does (init_weights: norms 1, biases 0, embeddings and head
normal(0, 1/sqrt(hidden)), the rest normal(0, 0.02)); made on --device (the GPU: seconds for 8.8B parameters),
written once: a dir holding a complete model (the .complete marker, written last) is reused.

usage: make_model.py --out DIR --tokenizer-from TINY_QWEN3_VL_DIR [--preset qwen3-vl-8b|tiny] [--device cuda]
"""
import argparse
import copy
import json
import os
import shutil
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bench", "mm_cpt"))
from make_vl_model import init_weights, save_model_dir  # noqa: E402

TEMPLATE = os.path.join(ROOT, "tests", "data", "chat_templates", "Qwen-Qwen3-VL-8B-Instruct.jinja")
# Qwen/Qwen3-VL-8B-Instruct's text_config (see the docstring).
TEXT_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
               num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
               max_position_embeddings=262144)
ROPE_8B = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_interleaved": True, "mrope_section": [24, 20, 20]}
# transformers 5.23's Qwen3VLVisionConfig defaults (the 8B's tower), written out so the dir says what it is.
VISION_8B = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16, temporal_patch_size=2,
                 spatial_merge_size=2, num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24],
                 hidden_act="gelu_pytorch_tanh", out_hidden_size=4096)
# The hub's preprocessor_config.json of Qwen3-VL-8B-Instruct.
PROCESSOR_8B = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer-from", required=True, help="an `axengine init-model --preset tiny-qwen3-vl` dir")
    ap.add_argument("--preset", default="qwen3-vl-8b", choices=("qwen3-vl-8b", "tiny"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if os.path.exists(os.path.join(args.out, ".complete")):
        print(f"make_model: {args.out} exists, reused")
        return

    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    cfg = copy.deepcopy(json.load(open(os.path.join(args.tokenizer_from, "config.json"))))
    if cfg.get("model_type") != "qwen3_vl":
        sys.exit(f"make_model: {args.tokenizer_from} is not a qwen3_vl dir (init-model --preset tiny-qwen3-vl)")
    proc = json.load(open(os.path.join(args.tokenizer_from, "preprocessor_config.json")))
    if args.preset == "qwen3-vl-8b":
        cfg["text_config"].update(TEXT_8B, rope_parameters=ROPE_8B)
        cfg["vision_config"].update(VISION_8B)
        cfg["tie_word_embeddings"] = False
        proc.update(PROCESSOR_8B)
    cfg["dtype"] = "bfloat16"
    config = Qwen3VLConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(config).to(torch.bfloat16)
    init_weights(model, cfg["text_config"]["hidden_size"], args.device, args.seed)
    # The files besides the weights: the tokenizer's, the processor's (8B: the hub's bounds) and the template.
    with tempfile.TemporaryDirectory() as files:
        for f in os.listdir(args.tokenizer_from):
            if f.startswith(("tokenizer", "generation", "special_tokens")):
                shutil.copy(os.path.join(args.tokenizer_from, f), files)
        json.dump(proc, open(os.path.join(files, "preprocessor_config.json"), "w"), indent=1)
        shutil.copy(TEMPLATE, os.path.join(files, "chat_template.jinja"))
        save_model_dir(model, args.out, files)
    total = sum(p.numel() for p in model.parameters())
    vis = sum(p.numel() for n, p in model.named_parameters() if "visual" in n)
    print(f"make_model: wrote a {args.preset} Qwen3-VL model ({total / 1e9:.3g}B parameters, vision "
          f"{vis / 1e9:.3g}B) to {args.out}")


if __name__ == "__main__":
    sys.exit(main())
