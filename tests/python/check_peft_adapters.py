#!/usr/bin/env python3
"""HF peft / transformers load what axengine writes.

1. Runs the axengine_tests case "peft export*" with AXENGINE_PEFT_EXPORT_DIR set: for every model family it
   writes a LoRA adapter (PEFT format), the logits axengine computes with it, and a merged model dir.
2. Loads each base model with transformers, the adapter with peft.PeftModel.from_pretrained, and checks the
   logits match axengine's; loads the adapter alone with AutoPeftModelForCausalLM (the base from
   adapter_config.json's base_model_name_or_path) and the merged dir with transformers: the same logits.
   A QLoRA case (qlora.json beside the adapter) was trained against an nf4-packed base: the fair golden is the
   HF model whose projections went through nf4 and back. This script packs them itself, from the HF model's
   own parameters (bitsandbytes' quantize_4bit/dequantize_4bit when bitsandbytes is installed, else the same
   algorithm written here in torch), so the base peft sees does not come from axengine.
3. Runs `axengine init-model` for every preset and loads the result with transformers (model + tokenizer).

usage: check_peft_adapters.py AXENGINE_TESTS_BINARY AXENGINE_BINARY
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from peft import AutoPeftModelForCausalLM, PeftModel
from safetensors.torch import load_file

TOL = 1e-4


def load_base(path):
    m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    m.config._experts_implementation = "eager"
    # An MXFP4 checkpoint dequantises to bf16 on transformers versions without the `kernels` package path (5.17);
    # FP4 values times E8M0 scales are exact in fp32 too.
    return m.float().eval()


# gpt_oss's goldens and our parity follow transformers 5.23 (scripts/requirements-goldens.txt); older releases
# compute the family differently (5.17, the GPU machine's: logits 16% off), so these cases need the pinned peer.
def peer_too_old(case):
    need = (5, 23) if case.replace("-", "_").removeprefix("tiny_").startswith("gpt_oss") else (0, 0)
    have = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    if have < need:
        print(f"{case}: skipped, needs transformers >= {need[0]}.{need[1]} (have {transformers.__version__})")
    return have < need


# bitsandbytes functional.get_4bit_type("nf4")
NF4 = torch.tensor([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                    0.7229568362236023, 1.0])
# The QLoRA policy (docs/weights.md): attention, linear-attention, MLP, expert and shared-expert projections are
# packed; embeddings, lm_head, routers (mlp.gate), norms, biases and the linear attention's conv1d, A_log and
# dt_bias are not (models/weight_policy.cpp's is_projection).
PACKED = (".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight", ".mlp.gate_proj.weight",
          ".mlp.up_proj.weight", ".mlp.down_proj.weight", ".mlp.experts.gate_up_proj", ".mlp.experts.down_proj",
          ".linear_attn.in_proj_qkv.weight", ".linear_attn.in_proj_z.weight", ".linear_attn.in_proj_b.weight",
          ".linear_attn.in_proj_a.weight", ".linear_attn.in_proj_qkvz.weight", ".linear_attn.in_proj_ba.weight",
          ".linear_attn.out_proj.weight", ".mlp.shared_expert.gate_proj.weight", ".mlp.shared_expert.up_proj.weight",
          ".mlp.shared_expert.down_proj.weight", ".mlp.shared_expert_gate.weight",
          # DeepSeek-V3 / GLM-4.5's shared experts and multi-head latent attention
          ".mlp.shared_experts.gate_proj.weight", ".mlp.shared_experts.up_proj.weight",
          ".mlp.shared_experts.down_proj.weight", ".q_a_proj.weight", ".q_b_proj.weight", ".kv_a_proj_with_mqa.weight",
          ".kv_b_proj.weight")


def nf4_roundtrip(w, blocksize):
    """bitsandbytes quantize_4bit(quant_type="nf4") then dequantize_4bit, on the flattened tensor. bitsandbytes
    0.50 refuses blocksize 16 (axengine admits it): that one, like a missing bitsandbytes, takes the same
    algorithm written in torch below."""
    try:
        import bitsandbytes.functional as bnbf
        if blocksize >= 32:
            q, state = bnbf.quantize_4bit(w.float().contiguous(), blocksize=blocksize, quant_type="nf4")
            return bnbf.dequantize_4bit(q, state).reshape(w.shape).to(w.dtype)
    except ImportError:
        pass
    blocks = w.float().reshape(-1, blocksize)
    absmax = blocks.abs().max(1).values
    scaled = torch.clamp(blocks * torch.reciprocal(absmax.clamp_min(1e-38)).unsqueeze(1), -1, 1).reshape(-1)
    codes = torch.bucketize(scaled, (NF4[:-1] + NF4[1:]) / 2, out_int32=True)  # ties go to the lower code
    return (NF4[codes.long()].reshape(-1, blocksize) * absmax.unsqueeze(1)).reshape(w.shape).to(w.dtype)


def pack_base(model, policy):
    assert policy["format"] == "nf4" and not policy["double_quant"], policy
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(PACKED):
                p.copy_(nf4_roundtrip(p, policy["blocksize"]))
                n += 1
    assert n > 0, "no projection was packed"
    return model


def main():
    tests_bin, axengine_bin = sys.argv[1], sys.argv[2]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, AXENGINE_PEFT_EXPORT_DIR=tmp)
        subprocess.run([tests_bin, "-tc=peft export*"], env=env, check=True)
        cases = sorted(os.listdir(tmp))
        assert cases, "axengine wrote no cases"
        for case in cases:
            if peer_too_old(case):
                continue
            d = os.path.join(tmp, case)
            base_dir = open(os.path.join(d, "base_dir.txt")).read().strip()
            expected = load_file(os.path.join(d, "expected.safetensors"))
            ids, want = expected["input_ids"], expected["logits"]
            scale = max(1.0, want.abs().max().item())
            base = load_base(base_dir)
            qlora = os.path.join(d, "qlora.json")
            if os.path.exists(qlora):
                base = pack_base(base, json.load(open(qlora)))
            model = PeftModel.from_pretrained(base, os.path.join(d, "adapter")).eval()
            with torch.no_grad():
                got = model(input_ids=ids).logits
            err = (got - want).abs().max().item() / scale
            print(f"{case}: peft adapter logits rel err {err:.2e}")
            if not err <= TOL:
                failures.append(f"{case}: peft logits differ by {err}")
            if not os.path.exists(qlora):
                # adapter_config.json's base_model_name_or_path names the base: peft loads both from the adapter dir.
                auto = AutoPeftModelForCausalLM.from_pretrained(os.path.join(d, "adapter"), dtype=torch.float32).eval()
                auto.base_model.model.config._experts_implementation = "eager"
                with torch.no_grad():
                    got = auto(input_ids=ids).logits
                err = (got - want).abs().max().item() / scale
                print(f"{case}: AutoPeftModelForCausalLM logits rel err {err:.2e}")
                if not err <= TOL:
                    failures.append(f"{case}: AutoPeftModelForCausalLM logits differ by {err}")
            merged = load_base(os.path.join(d, "merged"))
            with torch.no_grad():
                got = merged(input_ids=ids).logits
            err = (got - want).abs().max().item() / scale
            print(f"{case}: merged model logits rel err {err:.2e}")
            if not err <= TOL:
                failures.append(f"{case}: merged logits differ by {err}")
        for preset in ["tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-qwen3", "tiny-qwen3-moe", "tiny-mixtral",
                       "tiny-gemma3", "tiny-olmoe", "tiny-gpt-oss", "tiny-qwen3_5",
                       "tiny-qwen3_5-moe", "tiny-qwen3-next",
                       "tiny-glm4-moe", "tiny-deepseek-v3"]:
            if peer_too_old(preset):
                continue
            out = os.path.join(tmp, "init-" + preset)
            subprocess.run([axengine_bin, "init-model", "--preset", preset, "--out", out, "--seed", "3"], check=True)
            m = load_base(out)
            tok = transformers.AutoTokenizer.from_pretrained(out)
            ids = tok("hello world, the quick brown fox", return_tensors="pt").input_ids
            with torch.no_grad():
                logits = m(input_ids=ids).logits
            if not torch.isfinite(logits).all() or logits.shape[-1] != m.config.vocab_size:
                failures.append(f"{preset}: bad logits from the init-model dir")
            # Every tensor in the checkpoint is one transformers expects (no unused / missing weights).
            _, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
            if any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")):
                failures.append(f"{preset}: loading info {info}")
            print(f"{preset}: loads in transformers ({sum(p.numel() for p in m.parameters())} params)")
        check_tiny_vl(axengine_bin, tmp, failures)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)


def check_tiny_vl(axengine_bin, tmp, failures):
    """init-model --preset tiny-qwen2_5-vl: transformers loads every tensor, its tokenizer has the vision tokens
    config.json names, and its image processor (preprocessor_config.json) makes patches the model takes."""
    from PIL import Image
    out = os.path.join(tmp, "init-tiny-qwen2_5-vl")
    subprocess.run([axengine_bin, "init-model", "--preset", "tiny-qwen2_5-vl", "--out", out, "--seed", "3"], check=True)
    m, info = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(out, output_loading_info=True)
    if any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")):
        failures.append(f"tiny-qwen2_5-vl: loading info {info}")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    c = m.config
    if tok.convert_tokens_to_ids(["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]) != [
            c.vision_start_token_id, c.image_token_id, c.vision_end_token_id]:
        failures.append("tiny-qwen2_5-vl: the tokenizer's vision tokens are not config.json's ids")
    proc = transformers.AutoImageProcessor.from_pretrained(out)
    img = Image.fromarray((torch.arange(90 * 130 * 3) % 251).reshape(90, 130, 3).to(torch.uint8).numpy())
    px = proc(images=[img], return_tensors="pt")
    n = int(px["image_grid_thw"].prod()) // 4
    ids = tok("a picture <|vision_start|>" + "<|image_pad|>" * n + "<|vision_end|> of noise", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = m(input_ids=ids, pixel_values=px["pixel_values"], image_grid_thw=px["image_grid_thw"]).logits
    if px["pixel_values"].shape[-1] != 1176 or not torch.isfinite(logits).all():
        failures.append(f"tiny-qwen2_5-vl: pixel_values {tuple(px['pixel_values'].shape)}, finite logits {torch.isfinite(logits).all()}")
    print(f"tiny-qwen2_5-vl: loads in transformers, {n} image tokens for a 130x90 image")


if __name__ == "__main__":
    main()
