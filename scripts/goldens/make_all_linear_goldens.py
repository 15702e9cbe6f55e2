#!/usr/bin/env python3
"""What peft's target_modules="all-linear" selects on each decoder family (peft 0.21.2, transformers 5.23).

peft resolves "all-linear" in _maybe_include_all_linear_layers: every nn.Linear (or Conv1D) of the model but the
output embeddings (lm_head). On the MoE families transformers 5 fuses (qwen3_moe and olmoe as qwen2_moe, mixtral),
convert_peft_config_for_transformers then adds what was an nn.Linear in transformers 4: the experts'
gate/up/down projections (fused gate_up_proj at rank 2r, alpha 2·alpha; down_proj) and the router (`gate.weight`),
as target_parameters. gpt_oss's experts and router were never nn.Linear: attention only.

Writes tests/data/models/all_linear.json: per family (a tiny model of the family's config class, two layers, the
second dense where the family has dense layers), the LoRA sites peft made, each {"path", "r", "alpha"}: the
module a LoraLayer wraps, or "<module>.<parameter>" for a targeted parameter (ParamWrapper).
tests/unit/model_all_linear_test.cpp resolves "all-linear" with axengine on the same configs and compares.
Run with the project venv:  /root/.cache/axengine/venv/bin/python scripts/goldens/make_all_linear_goldens.py
(versions pinned in scripts/requirements.txt).
"""
import json
import os

import peft
import torch
import transformers
from peft.tuners.lora import LoraLayer
from peft.tuners.lora.layer import ParamWrapper

assert peft.__version__ == "0.21.2", peft.__version__
assert transformers.__version__ == "5.23.0", transformers.__version__

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "models", "all_linear.json")

BASE = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, head_dim=16)
HYBRID = dict(layer_types=["linear_attention", "full_attention"], linear_key_head_dim=16, linear_value_head_dim=16,
              linear_num_key_heads=2, linear_num_value_heads=4)
CONFIGS = {
    "llama": dict(model_type="llama", attention_bias=True, mlp_bias=True),
    "mistral": dict(model_type="mistral"),
    "qwen2": dict(model_type="qwen2"),
    "qwen3": dict(model_type="qwen3"),
    # layer 1 dense (mlp_only_layers): both kinds of MLP show
    "qwen3_moe": dict(model_type="qwen3_moe", moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                      mlp_only_layers=[1]),
    "mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2),
    "olmoe": dict(model_type="olmoe", num_experts=4, num_experts_per_tok=2, head_dim=None),
    "gemma3_text": dict(model_type="gemma3_text", layer_types=["sliding_attention", "full_attention"], sliding_window=8),
    "gpt_oss": dict(model_type="gpt_oss", num_local_experts=4, num_experts_per_tok=2,
                    layer_types=["sliding_attention", "full_attention"], sliding_window=8),
    # the hybrids: a Gated DeltaNet layer and a full-attention one; qwen3_5_moe's targets are not converted (its
    # routers and experts are not nn.Linear: the shared expert's modules only), qwen3_next's are (qwen2_moe's)
    "qwen3_5": dict(model_type="qwen3_5_text", **HYBRID),
    "qwen3_5_moe": dict(model_type="qwen3_5_moe_text", moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                        shared_expert_intermediate_size=48, **HYBRID),
    "qwen3_next": dict(model_type="qwen3_next", moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                       shared_expert_intermediate_size=48, mlp_only_layers=[1], **HYBRID),
}
R, ALPHA = 4, 8


def sites(model):
    out = []
    prefix = "base_model.model."
    for name, module in model.named_modules():
        if isinstance(module, ParamWrapper):
            # nested ParamWrappers (gate_up_proj inside down_proj's): the parameter's own module path
            path = name[len(prefix):].replace(".base_layer", "") + "." + module.parameter_name
        elif isinstance(module, LoraLayer):
            path = name[len(prefix):]
        else:
            continue
        out.append({"path": path, "r": module.r["default"], "alpha": module.lora_alpha["default"]})
    return sorted(out, key=lambda s: s["path"])


def main():
    torch.manual_seed(0)
    cases = []
    for family, extra in CONFIGS.items():
        config = dict(BASE, **extra)
        config = {k: v for k, v in config.items() if v is not None}
        cfg = transformers.AutoConfig.for_model(**config)
        model = transformers.AutoModelForCausalLM.from_config(cfg)
        lora = peft.get_peft_model(model, peft.LoraConfig(r=R, lora_alpha=ALPHA, target_modules="all-linear"))
        cfg_json = json.loads(cfg.to_json_string())
        cases.append({"family": family, "config": cfg_json, "r": R, "alpha": ALPHA, "sites": sites(lora)})
        print(family, len(cases[-1]["sites"]), sorted({s["path"].split(".", 3)[-1] for s in cases[-1]["sites"]}))
    with open(OUT, "w") as f:
        json.dump(cases, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
