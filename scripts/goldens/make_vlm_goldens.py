#!/usr/bin/env python3
"""Parity goldens for the qwen2_5_vl, qwen3_vl and qwen3_vl_moe families (Qwen2_5_VL- / Qwen3VL- /
Qwen3VLMoeForConditionalGeneration), transformers + peft, CPU fp32.

tests/data/models/<family>/ gets:
  config.json, model.safetensors   a tiny random model as save_pretrained writes it (visual.*, model.layers.*)
  adapter/                         a peft LoRA adapter on the language model (B random so every factor matters)
  golden.safetensors               per sample k: ids.k, labels.k, logits.k (with the adapter), and for the
                                   samples with images pixel_values.k [n_patches, patch_dim] and grid.k
                                   [n_images, 3]; loss (the mean token loss over all three samples, as one
                                   packed batch computes it) and grad.<peft key> of every LoRA factor

Samples: 0 holds two images of different sizes (one 4x6 patches, one 8x10: windows cut at the image's edge),
1 one image of another shape (6x4), 2 is text only. transformers runs each alone (no padding, positions from
its get_rope_index); tests/unit/model_qwen2_5_vl_test.cpp packs them into rows.

patch_size is 2 (patch_dim 3*2*2*2 = 24) to keep the files small; the code paths are those of 14 (1176).

qwen3_vl (Qwen3-VL: learned position embeddings interpolated to each grid, deepstack, interleaved mrope, the
qwen3 text stack): the same three samples' shapes plus a 1x2x4 grid, on a 3-layer text stack so that the layer
after the deepstack ones runs too; deepstack_visual_indexes [2, 0] (out of order: the features go to the
decoder layers in block order, each through the merger at its index in the list).

qwen3_vl_moe (Qwen3-VL-MoE): qwen3_vl's model and samples over a qwen3_moe text stack: 4 experts of 12 (2I = 24,
not the hidden 48, so that save_pretrained's transposed [E, H, 2I] differs from the module's [E, 2I, H]), top 2,
layer 1 dense (mlp_only_layers); the adapter also targets the fused experts by their parameters (peft's
target_parameters; peft converts no target module on this model), gate_proj/up_proj/down_proj then name layer 1's MLP.

Run with the project venv:  /root/.cache/axengine/venv/bin/python scripts/goldens/make_vlm_goldens.py [FAMILY...]
(default: all)
"""
import sys
import os
import shutil

import torch
import transformers

from vlm_common import IMG, MODELS, check_pins, lora_adapter, sample_goldens, save_golden, text

VID, VS, VE = 91, 92, 93


def qwen2_5_vl_config():
    return transformers.Qwen2_5_VLConfig(
        text_config=dict(vocab_size=97, hidden_size=48, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=256,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "mrope_section": [1, 2, 3]},
                         bos_token_id=1, eos_token_id=2, pad_token_id=0),
        # head_dim 16; window_size 8 = 2 merge blocks of 2x2 patches of 2 pixels; block 1 has full attention.
        vision_config=dict(depth=3, hidden_size=32, intermediate_size=24, num_heads=2, out_hidden_size=48, patch_size=2,
                           temporal_patch_size=2, spatial_merge_size=2, window_size=8, fullatt_block_indexes=[1]),
        image_token_id=IMG, video_token_id=VID, vision_start_token_id=VS, vision_end_token_id=VE, tie_word_embeddings=False)


def qwen3_vl_config():
    return transformers.Qwen3VLConfig(
        # head_dim 16: 8 frequencies, interleaved T H W T H W T T (mrope_section [4, 2, 2], as [24, 20, 20] of 64).
        text_config=dict(vocab_size=97, hidden_size=48, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=256,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "mrope_section": [4, 2, 2],
                                          "mrope_interleaved": True},
                         bos_token_id=1, eos_token_id=2, pad_token_id=0),
        # 16 learned positions (a 4x4 grid) interpolated to every image's grid.
        vision_config=dict(depth=3, hidden_size=16, intermediate_size=24, num_heads=2, out_hidden_size=48, patch_size=2,
                           temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
                           deepstack_visual_indexes=[2, 0]),
        image_token_id=IMG, video_token_id=VID, vision_start_token_id=VS, vision_end_token_id=VE, tie_word_embeddings=False)


def qwen3_vl_moe_config():
    base = qwen3_vl_config()
    text = base.text_config.to_dict()
    text = {k: text[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                 "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings",
                                 "rope_parameters", "bos_token_id", "eos_token_id", "pad_token_id")}
    text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=12, decoder_sparse_step=1, mlp_only_layers=[1])
    vision = base.vision_config.to_dict()
    vision = {k: vision[k] for k in ("depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size", "patch_size",
                                     "temporal_patch_size", "spatial_merge_size", "num_position_embeddings",
                                     "deepstack_visual_indexes")}
    return transformers.Qwen3VLMoeConfig(text_config=text, vision_config=vision, image_token_id=IMG, video_token_id=VID,
                                         vision_start_token_id=VS, vision_end_token_id=VE, tie_word_embeddings=False)


# peft target_parameters per family (the fused experts).
TARGET_PARAMETERS = {"qwen3_vl_moe": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]}

FAMILIES = {
    "qwen2_5_vl": (qwen2_5_vl_config, "Qwen2_5_VLForConditionalGeneration", [[[1, 4, 6], [1, 8, 10]], [[1, 6, 4]], []]),
    "qwen3_vl": (qwen3_vl_config, "Qwen3VLForConditionalGeneration", [[[1, 4, 6], [1, 8, 10]], [[1, 6, 4], [1, 2, 4]], []]),
    "qwen3_vl_moe": (qwen3_vl_moe_config, "Qwen3VLMoeForConditionalGeneration",
                     [[[1, 4, 6], [1, 8, 10]], [[1, 6, 4], [1, 2, 4]], []]),
}


def image(grid):
    t, h, w = grid
    return [VS] + [IMG] * (t * h * w // 4) + [VE]


def check_transposed_experts_load(out, model, model_class):
    """save_pretrained writes the fused experts as the module holds them ([E, 2I, H], [E, H, I]); the hub's
    Qwen3-VL-MoE checkpoints hold them transposed ([E, H, 2I], [E, I, H]), which transformers' conversion
    (Transpose with check_dims) turns back at load: check that it does, so that the C++ test's transposed copy
    of this checkpoint stands for the hub's layout."""
    import tempfile
    from safetensors.torch import load_file
    sd = load_file(os.path.join(out, "model.safetensors"))
    with tempfile.TemporaryDirectory() as d:
        for f in os.listdir(out):
            if f.endswith(".json"):
                shutil.copy(os.path.join(out, f), d)
        save_file({k: v.transpose(1, 2).contiguous() if ".mlp.experts." in k else v for k, v in sd.items()},
                  os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        again = getattr(transformers, model_class).from_pretrained(d)
    mine = model.state_dict()
    for k, v in again.state_dict().items():
        assert torch.equal(v, mine[k]), k


def make(family):
    make_config, model_class, grids = FAMILIES[family]
    out = os.path.join(MODELS, family)
    torch.manual_seed(1234)
    cfg = make_config()
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    cfg.vision_config._attn_implementation = "eager"
    cfg.text_config._experts_implementation = "eager"  # the per-expert loop of modeling_*.py
    cfg.initializer_range = 0.2
    cfg.text_config.initializer_range = 0.2
    cfg.vision_config.initializer_range = 0.2
    model = getattr(transformers, model_class)(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or "ln_q" in n or "pos_embed" in n:
                p.add_(0.1 * torch.randn_like(p))  # weights at 1 would hide a missing norm
            elif n.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    if family in TARGET_PARAMETERS:
        check_transposed_experts_load(out, model, model_class)

    pm = lora_adapter(model, out, ".*visual.*", "visual", TARGET_PARAMETERS.get(family))
    os.remove(os.path.join(out, "adapter", "README.md"))  # peft's model card: nothing a test reads

    g = torch.Generator().manual_seed(7)
    samples = [text(g, 3) + image(grids[0][0]) + text(g, 4) + image(grids[0][1]) + text(g, 2),
               text(g, 5) + image(grids[1][0]) + text(g, 6),
               text(g, 12)]
    if len(grids[1]) > 1:
        samples[1] += image(grids[1][1]) + text(g, 3)
    golden = {}

    def inputs(k, ids):
        gr = grids[k]
        if not gr:
            return {}
        n = sum(t * h * w for t, h, w in gr)
        kw = dict(pixel_values=torch.randn(n, 3 * 2 * 2 * 2, generator=g), image_grid_thw=torch.tensor(gr),
                  mm_token_type_ids=(ids == IMG).int())
        golden[f"pixel_values.{k}"] = kw["pixel_values"]
        golden[f"grid.{k}"] = kw["image_grid_thw"]
        return kw

    loss = sample_goldens(pm, samples, inputs, golden)
    save_golden(golden, out, family, loss)


def main():
    check_pins()
    for family in sys.argv[1:] or list(FAMILIES):
        make(family)


if __name__ == "__main__":
    main()
