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

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "models", "gemma3_mm")
IMG, BOI, EOI = 90, 91, 92
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
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


def text(g, n):
    return torch.randint(3, 88, (n,), generator=g).tolist()


def image():
    return [BOI] + [IMG] * 4 + [EOI]


def main():
    assert transformers.__version__ == "5.23.0" and peft.__version__ == "0.21.2", "pinned peers expected"
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

    torch.manual_seed(99)
    lcfg = LoraConfig(r=2, lora_alpha=5, target_modules=TARGETS, exclude_modules=EXCLUDE, lora_dropout=0.0)
    pm = get_peft_model(model, lcfg)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(0.3 * torch.randn_like(p))
    assert not any("vision_tower" in n for n, p in pm.named_parameters() if p.requires_grad)
    pm.save_pretrained(os.path.join(OUT, "adapter"))

    g = torch.Generator().manual_seed(7)
    n_images = [2, 1, 0]
    samples = [text(g, 3) + image() + text(g, 7) + image() + text(g, 2),
               text(g, 5) + image() + text(g, 6),
               text(g, 12)]
    golden = {}
    total, count = 0.0, 0
    for k, (ids, n) in enumerate(zip(samples, n_images)):
        ids = torch.tensor(ids)[None]
        labels = ids.clone()
        labels[ids == IMG] = -100
        kw = dict(token_type_ids=(ids == IMG).long())
        if n:
            kw["pixel_values"] = torch.randn(n, 3, 8, 8, generator=g)
            golden[f"pixel_values.{k}"] = kw["pixel_values"]
        logits = pm(input_ids=ids, **kw).logits
        # The loss a packed batch of all three computes: summed token losses over all samples' targets.
        tgt = labels[0, 1:]
        total = total + torch.nn.functional.cross_entropy(logits[0, :-1].float(), tgt, ignore_index=-100, reduction="sum")
        count += int((tgt != -100).sum())
        golden[f"ids.{k}"] = ids[0]
        golden[f"labels.{k}"] = labels[0]
        golden[f"logits.{k}"] = logits[0].detach().contiguous()
        if n:  # the same sample with a causal mask only: the image mask must change the logits
            golden[f"logits_causal.{k}"] = pm(input_ids=ids, pixel_values=kw["pixel_values"]).logits[0].detach().contiguous()
    loss = total / count
    loss.backward()
    golden["loss"] = loss.detach().reshape(1)
    for n, p in pm.named_parameters():
        if p.requires_grad:
            golden["grad." + n.replace(".default", "")] = p.grad.detach().contiguous()
    save_file(golden, os.path.join(OUT, "golden.safetensors"))
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT) for f in fs)
    assert size < 450_000, size
    print(f"gemma3_mm: loss {loss.item():.6f}, {size} bytes")


if __name__ == "__main__":
    main()
