"""What the vision-language golden scripts share (make_vlm_goldens.py, make_gemma3_mm_goldens.py,
make_vlm_merge_goldens.py): the pinned peers, the token ids of the tiny models, the peft adapter they train
against and the golden of three samples run one by one (logits, the packed batch's loss, LoRA gradients)."""
import os

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "models")
IMG = 90  # the image placeholder token of every tiny VL model here
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def text(g, n):
    """n random text tokens (below every tiny model's special ids)."""
    return torch.randint(3, 88, (n,), generator=g).tolist()


def check_pins():
    assert transformers.__version__ == "5.23.0" and peft.__version__ == "0.21.2", "pinned peers expected"


def lora_adapter(model, out, exclude, vision_word, target_parameters=None):
    """peft LoRA on the language model (the vision side excluded; target_parameters: fused experts), B random so
    every factor matters, saved to out/adapter; returns the peft model."""
    torch.manual_seed(99)
    lcfg = LoraConfig(r=2, lora_alpha=5, target_modules=TARGETS, exclude_modules=exclude, lora_dropout=0.0,
                      target_parameters=target_parameters)
    pm = get_peft_model(model, lcfg)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(0.3 * torch.randn_like(p))
    assert not any(vision_word in n for n, p in pm.named_parameters() if p.requires_grad)
    pm.save_pretrained(os.path.join(out, "adapter"))
    return pm


def sample_goldens(pm, samples, inputs, golden, extra=None):
    """Runs each sample (token ids) alone with inputs(k, ids) -> the forward's keyword arguments; fills golden
    with ids.k, labels.k (image tokens -100), logits.k, the mean token loss over all samples (as one packed batch
    computes it) and grad.<peft key> of every LoRA factor. extra(k, ids, kw), when given, adds more per sample."""
    total, count = 0.0, 0
    for k, ids in enumerate(samples):
        ids = torch.tensor(ids)[None]
        labels = ids.clone()
        labels[ids == IMG] = -100
        kw = inputs(k, ids)
        logits = pm(input_ids=ids, **kw).logits
        # The loss a packed batch of all three computes: summed token losses over all samples' targets.
        tgt = labels[0, 1:]
        total = total + torch.nn.functional.cross_entropy(logits[0, :-1].float(), tgt, ignore_index=-100, reduction="sum")
        count += int((tgt != -100).sum())
        golden[f"ids.{k}"] = ids[0]
        golden[f"labels.{k}"] = labels[0]
        golden[f"logits.{k}"] = logits[0].detach().contiguous()
        if extra:
            extra(k, ids, kw)
    loss = total / count
    loss.backward()
    golden["loss"] = loss.detach().reshape(1)
    for n, p in pm.named_parameters():
        if p.requires_grad:
            golden["grad." + n.replace(".default", "")] = p.grad.detach().contiguous()
    return loss


def save_golden(golden, out, name, loss):
    save_file(golden, os.path.join(out, "golden.safetensors"))
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out) for f in fs)
    assert size < 500_000, size  # qwen3_vl_moe's experts: ~460 kB
    print(f"{name}: loss {loss.item():.6f}, {size} bytes")
