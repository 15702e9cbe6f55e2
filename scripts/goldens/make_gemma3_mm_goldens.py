#!/usr/bin/env python3
"""Parity goldens for the gemma3 multimodal family (Gemma3ForConditionalGeneration), transformers + peft, CPU fp32.

tests/data/models/gemma3_mm/ gets:
  config.json, model.safetensors   a tiny random model as save_pretrained writes it
  adapter/                         a peft LoRA adapter on the language model (B random so every factor matters)
  golden.safetensors               per sample k: ids.k, labels.k, logits.k (with the adapter), and for the
                                   samples with images pixel_values.k [n_images, 3, 8, 8]; loss (the mean token
                                   loss over all three samples, as one packed batch computes it) and grad.<peft
                                   key> of every LoRA factor

Samples: 0 holds two images, 1 one image, 2 is text only. transformers runs each alone with token_type_ids (so
the tokens of one image see each other: its bidirectional image mask), eager attention. The tiny config keeps
the paths of the real one: SigLIP patches of 2 pixels on 8 x 8 images (16 patches) average-pooled 2 x 2 to
mm_tokens_per_image = 4 soft tokens, sliding layers with a window of 6 (smaller than the samples, larger than
an image) and one full layer.

Run with the project venv:  ~/.cache/axengine/venv/bin/python scripts/goldens/make_gemma3_mm_goldens.py
"""
import os
import shutil

import torch
import transformers

from vlm_common import IMG, MODELS, check_pins, lora_adapter, sample_goldens, save_golden, text

OUT = os.path.join(MODELS, "gemma3_mm")
BOI, EOI = 91, 92
EXCLUDE = ".*vision_tower.*"


def config():
    return transformers.Gemma3Config(
        text_config=dict(vocab_size=97, hidden_size=48, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=6,
                         layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                         max_position_embeddings=256, bos_token_id=2, eos_token_id=1, pad_token_id=0,
                         rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                           num_attention_heads=2, image_size=8, patch_size=2, vision_use_head=False),
        mm_tokens_per_image=4, image_token_index=IMG, boi_token_index=BOI, eoi_token_index=EOI)


def image():
    return [BOI] + [IMG] * 4 + [EOI]


def main():
    check_pins()
    torch.manual_seed(1234)
    cfg = config()
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = "eager"
        c.initializer_range = 0.2
    model = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))  # (1 + w) norms at w = 0 and LayerNorms at 1 would hide a missing norm
            elif n.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "mm_input_projection_weight" in n or "position_embedding" in n:
                p.copy_(0.2 * torch.randn_like(p))  # zeros at init
    shutil.rmtree(OUT, ignore_errors=True)
    model.save_pretrained(OUT)

    pm = lora_adapter(model, OUT, EXCLUDE, "vision_tower")

    g = torch.Generator().manual_seed(7)
    n_images = [2, 1, 0]
    samples = [text(g, 3) + image() + text(g, 7) + image() + text(g, 2),
               text(g, 5) + image() + text(g, 6),
               text(g, 12)]
    golden = {}

    def inputs(k, ids):
        kw = dict(token_type_ids=(ids == IMG).long())  # the tokens of one image see each other
        if n_images[k]:
            kw["pixel_values"] = torch.randn(n_images[k], 3, 8, 8, generator=g)
            golden[f"pixel_values.{k}"] = kw["pixel_values"]
        return kw

    def causal(k, ids, kw):  # the same sample with a causal mask only: the image mask must change the logits
        if n_images[k]:
            golden[f"logits_causal.{k}"] = pm(input_ids=ids, pixel_values=kw["pixel_values"]).logits[0].detach().contiguous()

    loss = sample_goldens(pm, samples, inputs, golden, causal)
    save_golden(golden, OUT, "gemma3_mm", loss)


if __name__ == "__main__":
    main()
