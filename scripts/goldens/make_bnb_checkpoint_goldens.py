#!/usr/bin/env python3
"""Pre-quantised checkpoint goldens: tiny Qwen3 models saved by transformers in bitsandbytes 4-bit nf4 form, on CPU.

For each case, tests/data/bnb/<case>/ gets:
  config.json, model.safetensors   a dense random model loaded with BitsAndBytesConfig(load_in_4bit=True, nf4, ...)
                                   and written back by save_pretrained: the packed Linear weights with absmax,
                                   quant_map, nested_* and quant_state.bitsandbytes__nf4, as bitsandbytes serialises
                                   them (transformers quantises on CPU with bitsandbytes >= 0.49: nothing is built
                                   by hand)
  adapter/                         a peft LoRA adapter trained against that 4-bit base (B set to random values)
  golden.safetensors               input_ids; logits of the 4-bit model; logits_adapter with the adapter (peft on
                                   bitsandbytes Linear4bit), all computed by transformers in fp32 on CPU;
                                   deq.<name> (double-quant case): bitsandbytes' dequantize_4bit of one packed weight
  meta.json                        the versions that made them

Run with the project venv (pins: scripts/requirements-goldens.txt):
  /root/.cache/axengine/venv/bin/python scripts/goldens/make_bnb_checkpoint_goldens.py
Sizes: hidden 96, intermediate 192, so down_proj has 288 absmax blocks and double quantisation two nested blocks,
the second one partial (32 of 256).
"""
import json
import os
import platform
import shutil
import sys
import tempfile

import torch
import transformers
import peft
import bitsandbytes as bnb
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import BitsAndBytesConfig

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "bnb")

CFG = dict(vocab_size=53, hidden_size=96, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6,
           rope_parameters=dict(rope_type="default", rope_theta=10000.0), tie_word_embeddings=False)

CASES = {
    # double quantisation on: absmax uint8 + nested absmax / code / offset.
    "qwen3_nf4_dq": dict(double_quant=True, skip=None),
    # double quantisation off (fp32 absmax), and one MLP down projection left dense by llm_int8_skip_modules.
    "qwen3_nf4": dict(double_quant=False, skip=["lm_head", "layers.1.mlp.down_proj"]),
}
TARGETS = ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]
B, S = 2, 7


def make_case(name, spec):
    torch.manual_seed(1234)
    cfg = transformers.Qwen3Config(**CFG)
    cfg._attn_implementation = "eager"
    cfg.initializer_range = 0.2  # logits far from uniform
    dense = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in dense.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        dense.save_pretrained(tmp)
        qc = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=spec["double_quant"],
                                bnb_4bit_compute_dtype=torch.float32, llm_int8_skip_modules=spec["skip"])
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp, quantization_config=qc, device_map="cpu",
                                                                  attn_implementation="eager").eval()
    model.save_pretrained(d)
    for f in ("generation_config.json",):  # keep the directory to what the tests read
        if os.path.exists(os.path.join(d, f)):
            os.remove(os.path.join(d, f))

    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, cfg.vocab_size, (B, S), generator=g)
    golden = {"input_ids": ids}
    with torch.no_grad():
        golden["logits"] = model(input_ids=ids).logits.detach().contiguous()
        w = model.model.layers[0].self_attn.q_proj.weight
        if spec["double_quant"]:
            golden["deq.model.layers.0.self_attn.q_proj.weight"] = bnb.functional.dequantize_4bit(
                w.data, w.quant_state).float().contiguous()

    torch.manual_seed(99)
    lcfg = LoraConfig(r=2, lora_alpha=5, target_modules=TARGETS, lora_dropout=0.0)
    pm = get_peft_model(model, lcfg)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(0.3 * torch.randn_like(p))
        golden["logits_adapter"] = pm(input_ids=ids).logits.detach().contiguous()
    pm.save_pretrained(os.path.join(d, "adapter"))
    readme = os.path.join(d, "adapter", "README.md")
    if os.path.exists(readme):
        os.remove(readme)
    save_file(golden, os.path.join(d, "golden.safetensors"))
    meta = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
            "bitsandbytes": bnb.__version__, "python": platform.python_version(), "device": "cpu"}
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
    assert total < 300_000, f"{name}: {total} bytes"
    print(f"{name}: {total} bytes")


def main():
    assert transformers.__version__ == "5.23.0" and peft.__version__ == "0.21.2" and bnb.__version__ == "0.50.2", \
        "pinned peers expected (scripts/requirements-goldens.txt)"
    for n in sys.argv[1:] or list(CASES):
        make_case(n, CASES[n])


if __name__ == "__main__":
    main()
