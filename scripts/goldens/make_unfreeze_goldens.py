#!/usr/bin/env python3
"""Training goldens for [train] unfrozen_parameters, made by transformers + peft + torch.optim.AdamW on CPU in fp32.

Pinned: transformers 5.23.0, peft 0.21.2, torch 2.11.0 (the project venv).

tests/data/unfreeze/llama/ gets:
  config.json, model.safetensors   a tiny untied llama (attention biases, perturbed norms), save_pretrained's
  adapter/                         a peft LoRA adapter (q_proj, v_proj; B random) with modules_to_save=["lm_head"]
  golden_full.safetensors          full fine-tune (every parameter trains, no LoRA): input_ids/labels [steps, B, S],
                                   loss [steps + 1] (each step's, then after the last step), final.<name> per parameter
  golden_lora_head.safetensors     the adapter + lm_head (modules_to_save) from adapter/: loss as above,
                                   final.<peft key> of the factors and final.lm_head.weight

Both runs do what axengine's trainer does (train/trainer.cpp, adamw.cpp, schedule.cpp): one micro-batch per step,
the lr of Schedule (warmup then cosine to min_lr_ratio), the gradient clipped to max_grad_norm by
clip_grad_norm_, then AdamW (betas 0.9/0.999, eps 1e-8; foreach off: the single-tensor path axengine's reference
step mirrors), weight decay on every parameter but 1-D tensors, biases and norms (exempt_from_weight_decay).

Run with the project venv:  ~/.cache/axengine/venv/bin/python scripts/goldens/make_unfreeze_goldens.py
"""
import math
import os
import shutil

import peft
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import save_file

assert transformers.__version__ == "5.23.0", transformers.__version__
assert peft.__version__ == "0.21.2", peft.__version__
assert torch.__version__.startswith("2.11.0"), torch.__version__

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "unfreeze", "llama")
STEPS, B, S = 5, 2, 8
LR, WARMUP, MIN_LR_RATIO, WD, MAX_NORM = 1e-2, 2, 0.1, 0.1, 1.0


def schedule(step):  # train/schedule.cpp, cosine
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    span = max(1, STEPS - WARMUP - 1)
    progress = min(max((step - WARMUP) / span, 0.0), 1.0)
    return LR * (MIN_LR_RATIO + (1.0 - MIN_LR_RATIO) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def exempt(name, p):  # train/trainer.cpp exempt_from_weight_decay, on axengine's names
    return p.dim() < 2 or name.endswith(".bias") or name.endswith("_bias") or "norm" in name


def train(model, named, batches):
    decay = [p for n, p in named if not exempt(n, p)]
    no_decay = [p for n, p in named if exempt(n, p)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.999), eps=1e-8, foreach=False)
    params = [p for _, p in named]
    losses = []
    for step, (ids, labels) in enumerate(batches):
        for g in opt.param_groups:
            g["lr"] = schedule(step)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=False)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    with torch.no_grad():
        losses.append(model(input_ids=batches[0][0], labels=batches[0][1]).loss.item())
    return torch.tensor(losses, dtype=torch.float64)


def make_batches():
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, 48, (STEPS, B, S), generator=g)
    labels = ids.clone()
    labels[:, 0, 3] = -100
    labels[:, 1, :2] = -100
    return ids, labels


def base_model():
    torch.manual_seed(1234)
    cfg = transformers.LlamaConfig(vocab_size=48, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=4, rms_norm_eps=1e-6,
                                   attention_bias=True, tie_word_embeddings=False, initializer_range=0.1,
                                   rope_parameters=dict(rope_type="default", rope_theta=10000.0))
    cfg._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
            if n.endswith(".bias"):
                p.copy_(0.05 * torch.randn_like(p))
    return model


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    model = base_model()
    model.save_pretrained(OUT)
    ids, labels = make_batches()
    batches = [(ids[i], labels[i]) for i in range(STEPS)]

    # Full fine-tune: every parameter, as unfrozen_parameters = [".*"] without LoRA.
    named = list(model.named_parameters())
    losses = train(model.train(), named, batches)
    golden = {"input_ids": ids, "labels": labels, "loss": losses}
    for n, p in named:
        golden["final." + n] = p.detach().contiguous()
    save_file(golden, os.path.join(OUT, "golden_full.safetensors"))
    print("full:", [f"{v:.6f}" for v in losses.tolist()])

    # LoRA on q_proj, v_proj + lm_head as modules_to_save (= unfrozen_parameters ["^lm_head.weight$"]).
    model = base_model()
    torch.manual_seed(99)
    pm = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                                          modules_to_save=["lm_head"]))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(0.1 * torch.randn_like(p))
    pm.save_pretrained(os.path.join(OUT, "adapter"))
    # axengine's names: <module>.lora_A / .lora_B and lm_head.weight (decay: the same for both namings).
    named = [(n.replace(".default", "").replace("base_model.model.", "").replace(".modules_to_save", ""), p)
             for n, p in pm.named_parameters() if p.requires_grad]
    assert sorted(n for n, _ in named if "lora" not in n) == ["lm_head.weight"], named
    losses = train(pm.train(), named, batches)
    golden = {"loss": losses}
    for n, p in named:
        golden["final." + n] = p.detach().contiguous()
    save_file(golden, os.path.join(OUT, "golden_lora_head.safetensors"))
    print("lora + lm_head:", [f"{v:.6f}" for v in losses.tolist()])
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT) for f in fs)
    assert total < 200_000, total
    print(f"{total} bytes in {OUT}")


if __name__ == "__main__":
    main()
