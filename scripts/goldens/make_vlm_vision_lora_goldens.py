#!/usr/bin/env python3
"""Parity goldens for LoRA on the vision side (lora.vision_targets) of qwen3_vl and gemma3 multimodal,
transformers + peft, CPU fp32.

The base models and samples are those of make_vlm_goldens.py / make_gemma3_mm_goldens.py (tests/data/models/<case>/:
config.json, model.safetensors, golden.safetensors' ids, pixel_values and grids); this script adds to each:
  vision_adapter/            a peft LoRA adapter whose target_modules name the language model's projections and the
                             vision side's linear layers (B random so every factor matters), as a peft user writes it:
                               qwen3_vl:  the 7 projections + qkv, attn.proj, linear_fc1, linear_fc2 (the blocks' MLP
                                          and the mergers': peft's names select both)
                               gemma3_mm: the 7 projections + out_proj, fc1, fc2; q_proj / k_proj / v_proj then also
                                          select SigLIP's attention (no exclude_modules), so every linear layer of
                                          the tower carries an adapter
  vision_golden.safetensors  per sample k: ids.k, labels.k, logits.k (with the adapter); loss (the mean token loss
                             over the three samples, as one packed batch computes it) and grad.<peft key> of every
                             LoRA factor, the vision side's included

Run with the project venv:  /root/.cache/axengine/venv/bin/python scripts/goldens/make_vlm_vision_lora_goldens.py
"""
import json
import os
import shutil

import torch
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file

from vlm_common import IMG, MODELS, TARGETS, check_pins, sample_goldens, save_golden

CASES = {
    "qwen3_vl": ("Qwen3VLForConditionalGeneration", ["qkv", "attn.proj", "linear_fc1", "linear_fc2"], "visual"),
    "gemma3_mm": ("Gemma3ForConditionalGeneration", ["out_proj", "fc1", "fc2"], "vision_tower"),
}


def make(case):
    model_class, vision_targets, vision_word = CASES[case]
    out = os.path.join(MODELS, case)
    base = load_file(os.path.join(out, "golden.safetensors"))
    model = getattr(transformers, model_class).from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    torch.manual_seed(99)
    pm = get_peft_model(model, LoraConfig(r=2, lora_alpha=5, target_modules=TARGETS + vision_targets, lora_dropout=0.0))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(0.3 * torch.randn_like(p))
    wrapped = [n for n, p in pm.named_parameters() if p.requires_grad]
    assert any(vision_word in n for n in wrapped) and any("language_model" in n for n in wrapped)
    shutil.rmtree(os.path.join(out, "vision_adapter"), ignore_errors=True)
    pm.save_pretrained(os.path.join(out, "vision_adapter"))
    os.remove(os.path.join(out, "vision_adapter", "README.md"))  # peft's model card: nothing a test reads
    cfg_path = os.path.join(out, "vision_adapter", "adapter_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["base_model_name_or_path"] = None  # not this machine's path: the tests give the base
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)

    samples = [base[f"ids.{k}"].tolist() for k in range(3)]

    def inputs(k, ids):
        if f"pixel_values.{k}" not in base:
            return {}
        if case == "gemma3_mm":  # the tokens of one image see each other
            return dict(pixel_values=base[f"pixel_values.{k}"], token_type_ids=(ids == IMG).long())
        return dict(pixel_values=base[f"pixel_values.{k}"], image_grid_thw=base[f"grid.{k}"], mm_token_type_ids=(ids == IMG).int())

    golden = {}
    loss = sample_goldens(pm, samples, inputs, golden)
    # save_golden writes golden.safetensors: the base goldens stay, this one goes beside them.
    tmp = os.path.join(out, "vision_tmp")
    os.makedirs(tmp, exist_ok=True)
    save_golden(golden, tmp, case + " vision LoRA", loss)
    os.replace(os.path.join(tmp, "golden.safetensors"), os.path.join(out, "vision_golden.safetensors"))
    os.rmdir(tmp)


def main():
    check_pins()
    for case in CASES:
        make(case)


if __name__ == "__main__":
    main()
