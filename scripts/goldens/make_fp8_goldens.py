#!/usr/bin/env python3
"""Tiny fine-grained FP8 DeepSeek-V3 and GLM-4.5 checkpoints and what transformers 5.23 makes of them
(tests/data/models/deepseek_v3_fp8, glm4_moe_fp8).

The checkpoint is laid out as DeepSeek-V3's own FP8 release: every projection under model.layers (attention, dense
MLP, routed and shared experts) stored float8_e4m3fn with an fp32 `weight_scale_inv` per weight_block_size block;
embeddings, norms, routers, the correction bias and lm_head stay dense; config.json's quantization_config is the
hub's {quant_method fp8, fmt e4m3, activation_scheme dynamic, weight_block_size}. The block is [8, 16] (not square,
so rows and columns cannot be swapped) and every size divides by it, as every DeepSeek-V3 size but 576 divides by 128.
glm4_moe_fp8 is GLM-4.5-FP8's layout on a tiny glm4_moe (q/k/v biases, partial RoPE, shared experts) in the same
blocks; axengine's tests load both dequantised and kept packed (weight_format = "fp8") and compare the two.

golden.safetensors: input_ids and the logits of transformers' from_pretrained on the CPU, which dequantises at load
(FineGrainedFP8HfQuantizer -> dequantize=True -> Fp8Dequantize: fp8 value x block scale in fp32, cast to the model's
dtype), fp32 forward. ragged.safetensors: a weight whose sizes are not multiples of the block (as kv_a_proj_with_mqa's
576 rows are not of 128) with its scale grid and transformers' _dequantize_fp8_weight of it (the edge blocks take
their block's scale, as DeepSeek's weight_dequant does; Fp8Dequantize instead derives the block from the grid and
refuses such a grid).

Run with the project venv:  ~/.cache/axengine/venv/bin/python scripts/goldens/make_fp8_goldens.py
"""
import json
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_deepseek_glm_goldens as dsg  # noqa: E402
import make_model_goldens as mmg  # noqa: E402

BLOCK = [8, 16]
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448

CASES = {"deepseek_v3_fp8": dict(
    cls="DeepseekV3ForCausalLM", prepare=dsg.random_correction_bias,
    cfg=dict(model_type="deepseek_v3", vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=16, kv_lora_rank=16,
             qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, rope_interleave=True, n_routed_experts=8,
             num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1, first_k_dense_replace=1,
             routed_scaling_factor=2.5, norm_topk_prob=True, attention_bias=False, rms_norm_eps=1e-6,
             tie_word_embeddings=False, rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
), "glm4_moe_fp8": dict(
    cls="Glm4MoeForCausalLM", prepare=dsg.random_correction_bias,
    cfg=dict(model_type="glm4_moe", vocab_size=48, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, n_routed_experts=6,
             num_experts_per_tok=2, n_group=3, topk_group=2, n_shared_experts=1, first_k_dense_replace=1,
             routed_scaling_factor=1.7, norm_topk_prob=True, use_qk_norm=False, attention_bias=True,
             rms_norm_eps=1e-5, tie_word_embeddings=False,
             rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5)),
)}


def quantize(w):
    """DeepSeek's act_quant-style block quantisation of a [rows, cols] weight: scale = amax / 448 per block."""
    rows, cols = w.shape
    br, bc = BLOCK
    assert rows % br == 0 and cols % bc == 0, f"{tuple(w.shape)} not a multiple of {BLOCK}"
    blocks = w.reshape(rows // br, br, cols // bc, bc)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    q = (blocks / scale[:, None, :, None]).reshape(rows, cols).to(torch.float8_e4m3fn)
    return q, scale.float()


def make_case(d, case):
    # The dense model as every family golden makes it (make_model_goldens.make_case's initialisation), then
    # its save_pretrained checkpoint (per-expert names) with the projections quantised.
    dense_dir = tempfile.mkdtemp()
    try:
        torch.manual_seed(1234)
        import transformers
        cfg_cls = transformers.AutoConfig.for_model(case["cfg"]["model_type"]).__class__
        kw = dict(case["cfg"])
        kw.pop("model_type")
        cfg = cfg_cls(**kw)
        cfg._experts_implementation = "eager"
        cfg._attn_implementation = "eager"
        cfg.initializer_range = 0.2
        model = getattr(transformers, case["cls"])(cfg).eval()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "norm" in n:
                    p.add_(0.1 * torch.randn_like(p))
        case["prepare"](model)
        model.save_pretrained(dense_dir)
        sd = load_file(os.path.join(dense_dir, "model.safetensors"))
        out = {}
        n_fp8 = 0
        for name, t in sd.items():
            if name.startswith("model.layers.") and name.endswith("proj.weight"):
                q, s = quantize(t)
                out[name], out[name + "_scale_inv"] = q, s
                n_fp8 += 1
            else:
                out[name] = t
        assert n_fp8 > 20, n_fp8
        os.makedirs(d)
        save_file(out, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(dense_dir, "config.json")) as f:
            config = json.load(f)
        config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                         "weight_block_size": BLOCK}
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        g = torch.Generator().manual_seed(7)
        ids = torch.randint(0, cfg.vocab_size, (2, 9), generator=g)
        with torch.no_grad():
            want_dense = model(input_ids=ids).logits
        # transformers' own load of the FP8 checkpoint (no GPU: it dequantises).
        fp8 = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                                experts_implementation="eager",
                                                                attn_implementation="eager").eval()
        # It dequantised (no FP8Linear left) to the fp8 values times their scales, not to the dense model's.
        name = "model.layers.0.self_attn." + ("kv_b_proj" if "q_lora_rank" in case["cfg"] else "k_proj") + ".weight"
        w = fp8.get_parameter(name)
        br, bc = BLOCK
        mine = out[name].float() * out[name + "_scale_inv"].repeat_interleave(br, 0).repeat_interleave(bc, 1)
        assert w.dtype == torch.float32 and torch.equal(w, mine) and not torch.equal(w, sd[name])
        with torch.no_grad():
            logits = fp8(input_ids=ids).logits
        err = (logits - want_dense).abs().max().item()
        assert 1e-4 < err < 0.5 * want_dense.abs().max().item(), f"fp8 rounding changed the logits by {err}"
        save_file({"input_ids": ids, "logits": logits.contiguous()}, os.path.join(d, "golden.safetensors"))
        print(f"{d}: {n_fp8} fp8 weights, logits differ from the dense model's by {err:.4g}")
    finally:
        shutil.rmtree(dense_dir, ignore_errors=True)


def make_ragged(path):
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight
    g = torch.Generator().manual_seed(11)
    w = (torch.randn(20, 40, generator=g) * 3).to(torch.float8_e4m3fn)  # 20 = 2x8 + 4 rows, 40 = 2x16 + 8 columns
    scale = torch.rand(3, 3, generator=g) + 0.1
    want = _dequantize_fp8_weight(w, scale, BLOCK, torch.float32)
    save_file({"weight": w, "weight_scale_inv": scale, "dequantized": want.contiguous()}, path)


def main():
    import transformers
    assert transformers.__version__ == "5.23.0", "pinned peer expected"
    for name, case in CASES.items():
        d = os.path.join(mmg.OUT, name)
        shutil.rmtree(d, ignore_errors=True)
        make_case(d, case)
    make_ragged(os.path.join(mmg.OUT, "deepseek_v3_fp8", "ragged.safetensors"))


if __name__ == "__main__":
    main()
