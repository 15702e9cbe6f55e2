#!/usr/bin/env python3
"""The HF transformers + peft peer of bench/vlm_sft's axengine config: Qwen3-VL SFT on image conversations, the
same model dir, conversations, batches, LoRA and optimizer.

What an HF user runs: the model's processor (AutoProcessor: Qwen3VLProcessor with the fast image processor, the
model dir's chat template and preprocessor_config.json) renders each conversation with
`apply_chat_template(tokenize=True, return_dict=True)` (image paths made absolute: transformers opens them
relative to the working directory); labels on the assistant turns only (each assistant content and its
<|im_end|>, the span rule of docs/datasets.md, which axengine's chat_template rows apply; image tokens never);
Qwen3VLForConditionalGeneration (bf16, sdpa) + peft LoRA on the language model (exclude_modules ".*visual.*", as
axengine's adapters say) + fused torch AdamW + clip_grad_norm_, activation checkpointing when the config has it
(bench/train_step/hf_peer.py's load_model, train and run_variants: the same timing, rows and MFU).

The same batches: the samples (the processor's ids; the labels above) are packed with axengine's order and
first-fit rule (packed_rows.py: permutation, mix_seed, pack_samples, make_batch) into micro_batch_size rows of
sequence_len, each step's rows in axengine's epoch order; pixel_values and image_grid_thw of a step are its
samples' in token order. Packed samples attend to themselves only: position_ids [4, B, S] whose row 0 (text
positions, restarting at 0 per sample) gives transformers' block-diagonal causal mask
(masking_utils.find_packed_sequence_indices) and rows 1-3 are each sample's multimodal RoPE positions from the
model's own get_rope_index (restarting per sample, as axengine's). The axengine run's per-step token counts
(metrics.jsonl `tokens`) must equal this peer's (summarize.py: same_tokens_per_step), and the first step's loss
(LoRA B = 0: the base model's) must agree.

MFU: the step's matrix FLOPs are bench/train_step/flops.py's for the language model plus the frozen vision
tower's forward (vision_flops below; no backward: nothing before it needs a gradient).

usage: hf_peer_vlm.py CONFIG.toml --out peer.json [--variants eager,compile] [--device cuda] [--warmup 5]
       [--steps N] [--max-warmup 25] [--set KEY=VALUE ...]
"""
import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "train_step"))
import flops  # noqa: E402
import hf_peer  # noqa: E402
from packed_rows import (AxengineBatches, check_loss_tokens, make_batch, special_ids, spans)  # noqa: E402

IMAGE_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")


def check_entry(cfg_path, args):
    """The dataset entry this peer mirrors: one chat_template dataset, every row trained (no eval split, bad rows
    stop the run), loss on the assistant turns, the model's own processor bounds."""
    import tomllib
    cfg = tomllib.load(open(cfg_path, "rb"))
    for a in args.set:
        hf_peer.apply_set(cfg, a)
    ds, data = cfg["datasets"], cfg.get("data", {})
    e = ds[0]
    bad = [k for k in ("eval_path", "eval_split", "min_pixels", "max_pixels", "image_base_dir", "streaming") if k in e]
    if (len(ds) != 1 or e.get("type") != "chat_template" or e.get("train_on", "assistant") != "assistant" or bad
            or e.get("on_bad_row", "error") != "error" or e.get("eval_fraction", data.get("eval_fraction", 0.0)) != 0):
        sys.exit("hf_peer_vlm: mirrors one chat_template dataset with train_on = \"assistant\", on_bad_row = \"error\", "
                 f"eval_fraction = 0 and the model's processor settings (refused here: {bad or 'the above'})")


def absolute(messages, base):
    """The conversation transformers loads: image paths made absolute (relative ones are the data file's dir's)."""
    out = []
    for m in messages:
        c = m["content"]
        if isinstance(c, list):
            if any(p.get("type") not in ("text", "image") or (p["type"] == "image" and "image" not in p) for p in c):
                sys.exit("hf_peer_vlm: reads make_corpus.py's parts only: {\"type\": \"text\"} and "
                         "{\"type\": \"image\", \"image\": PATH}")
            c = [dict(p, image=os.path.join(base, p["image"])) if p["type"] == "image" else p for p in c]
        out.append({"role": m["role"], "content": c})
    return out


def assistant_labels(proc, conv, ids, grid, merge):
    """Labels of the processor's ids: the tokens inside an assistant turn's content + <|im_end|> (the span rule
    on the rendered text, as docs/datasets.md says axengine applies it), image tokens never."""
    text = proc.apply_chat_template(conv, tokenize=False)
    spans_, cursor = [], 0
    for m in conv:
        c = m["content"]
        parts = [c] if isinstance(c, str) else [p["text"] for p in c if p.get("type") == "text"]
        for p in parts:
            at = text.find(p, cursor)
            if at < 0:
                sys.exit(f"hf_peer_vlm: a content is not in the rendered text: {p[:60]!r}")
            if m["role"] == "assistant" and p is parts[0]:
                first = at
            cursor = at + len(p)
        if m["role"] == "assistant":
            assert text.startswith("<|im_end|>", cursor), "Qwen3-VL's template closes a turn with <|im_end|>"
            cursor += len("<|im_end|>")
            spans_.append((first, cursor))
    # The processor's expansion redone on the text: the k-th <|image_pad|> becomes its t*h*w/merge^2 pads.
    pad, counts = "<|image_pad|>", [int(t * h * w) // (merge * merge) for t, h, w in grid]
    pieces, pads, at = [], [], 0  # pads: (position in the text, characters the expansion adds there)
    for n in counts:
        p = text.index(pad, at)
        pieces += [text[at:p], pad * n]
        pads.append((p, len(pad) * (n - 1)))
        at = p + len(pad)
    pieces.append(text[at:])
    shift = lambda x: x + sum(g for p, g in pads if p < x)  # noqa: E731
    spans_ = [(shift(a), shift(b)) for a, b in spans_]
    enc = proc.tokenizer("".join(pieces), add_special_tokens=False, return_offsets_mapping=True)
    if enc["input_ids"] != ids:
        sys.exit("hf_peer_vlm: the processor's ids are not its expanded text's (a tokenizer/processor mismatch)")
    image_ids = set(proc.tokenizer.convert_tokens_to_ids(list(IMAGE_TOKENS)))
    return [t if t not in image_ids and any(b < e2 and e > b2 for b2, e2 in spans_) else -100
            for t, (b, e) in zip(ids, enc["offset_mapping"])]


def load_samples(jsonl, model_dir):
    """Per row of the JSONL: ((ids, labels), (pixel_values, image_grid_thw, mm_token_type_ids))."""
    from transformers import AutoProcessor
    proc = AutoProcessor.from_pretrained(model_dir)
    merge = proc.image_processor.merge_size
    base = os.path.dirname(os.path.abspath(jsonl))
    samples, extras = [], []
    for line in open(jsonl):
        if not line.strip():
            continue
        conv = absolute(json.loads(line)["messages"], base)
        out = proc.apply_chat_template(conv, tokenize=True, return_dict=True, return_tensors="pt")
        ids = out["input_ids"][0].tolist()
        grid = out.get("image_grid_thw")
        labels = assistant_labels(proc, conv, ids, grid.tolist() if grid is not None else [], merge)
        samples.append((ids, labels))
        extras.append((out.get("pixel_values"), grid, out["mm_token_type_ids"][0]))
    return samples, extras, proc


class VlmBatches(AxengineBatches):
    """axengine's batches of the samples (packed_rows.AxengineBatches' packing and epoch order), with the step's
    pixel_values, image_grid_thw and [4, B, S] position_ids. batch(step) -> (input_ids, labels, position_ids,
    real_tokens, pixel_values, image_grid_thw): the first four as packed_rows' batches."""

    def __init__(self, samples, extras, pad_id, S, micro_batch_size, seed, rope_index, jsonl):
        self.samples, self.extras, self.pad_id = samples, extras, pad_id
        check_loss_tokens(samples, S, jsonl)
        long_ = [i + 1 for i, (ids, _) in enumerate(samples) if len(ids) > S]
        if long_:  # axengine cuts them or refuses them (images past sequence_len): not mirrored here
            sys.exit(f"hf_peer_vlm: {jsonl}: rows {long_[:5]} are longer than sequence_len = {S}")
        self.rope = [rope_index(ids, ex) for (ids, _), ex in zip(samples, extras)]
        self._plan(S, micro_batch_size, seed)  # AxengineBatches' packing and epoch order, on these samples

    def batch(self, step):
        row_ids = self.row_ids(step)
        ids, labels, pos, real = make_batch(self.samples, self.rows, row_ids, self.S, self.pad_id)
        mpos = pos[None].repeat(4, 1, 1)  # text positions; the padding span's on every axis
        pixels, grids = [], []
        for b, r in enumerate(row_ids):
            t = 0
            for idx in self.rows[r]:
                n = len(self.samples[idx][0])
                mpos[1:, b, t:t + n] = self.rope[idx]
                pv, grid, _ = self.extras[idx]
                if grid is not None:
                    pixels.append(pv)
                    grids.append(grid)
                t += n
        pv = torch.cat(pixels) if pixels else None
        return ids, labels, mpos, real, pv, torch.cat(grids) if grids else None


def vlm_inputs(b):
    out = {"input_ids": b[0], "labels": b[1], "position_ids": b[2]}
    if b[4] is not None:
        out.update(pixel_values=b[4], image_grid_thw=b[5])
    return out


def vision_flops(vcfg, grids):
    """The frozen tower's forward matrix FLOPs over images of grids [(t, h, w) patches]: the patch embedding
    (a matmul of in_channels·temporal·patch² -> hidden), per block qkv, proj, fc1, fc2 and full (non-causal)
    attention within each image (QKᵀ and PV: 4·N²·hidden), and the main + deepstack mergers (N/merge² tokens of
    merge²·hidden -> merge²·hidden -> out_hidden)."""
    h, i, m2 = vcfg["hidden_size"], vcfg["intermediate_size"], vcfg.get("spatial_merge_size", 2) ** 2
    k_in = vcfg.get("in_channels", 3) * vcfg.get("temporal_patch_size", 2) * vcfg.get("patch_size", 16) ** 2
    mergers = 1 + len(vcfg.get("deepstack_visual_indexes", []))
    total = 0
    for t, hh, ww in grids:
        n = t * hh * ww
        total += 2 * n * k_in * h
        total += vcfg["depth"] * (2 * n * (4 * h * h + 2 * h * i) + 4 * n * n * h)
        total += mergers * 2 * (n // m2) * (m2 * h) * (m2 * h + vcfg["out_hidden_size"])
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default="eager")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, help="timed steps (default: the config's max_steps - warmup, as axengine)")
    ap.add_argument("--max-warmup", type=int, default=25, help="warm-up steps at most, waiting for compiles to end")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override (axengine's syntax)")
    args = ap.parse_args()
    args.model = args.data = args.seq_len = args.batch = None  # hf_peer.read_config's test overrides: not used
    check_entry(args.config, args)
    c = hf_peer.read_config(args.config, args, check_dataset=False)
    variants = args.variants.split(",")
    if any(v not in ("eager", "compile") for v in variants):
        sys.exit(f"hf_peer_vlm: variants are eager, compile (got {args.variants})")
    if (args.steps or c["max_steps"] - args.warmup) <= 0:
        sys.exit("hf_peer_vlm: no timed steps (give --steps, or a config with max_steps > --warmup)")
    device, cuda = args.device, args.device.startswith("cuda")
    torch.manual_seed(c["seed"])
    res = {"device": torch.cuda.get_device_name() if cuda else "cpu", "model": c["model"],
           "batch": [c["batch"], c["seq_len"]], "rows": []}
    res["gemm"] = flops.gemm_rate(device, c["dtype"])  # first, while the device is empty
    print(f"hf_peer_vlm: GEMM rate {res['gemm']['flops_per_s'] / 1e12:.4g} TFLOP/s")

    t = time.perf_counter()
    samples, extras, proc = load_samples(c["data"], c["model"])
    t_proc = time.perf_counter() - t
    n_images = sum(len(g) for _, g, _ in extras if g is not None)
    print(f"hf_peer_vlm: {len(samples)} conversations, {n_images} images processed in {t_proc:.1f} s")

    t = time.perf_counter()
    model, params, _, setup = hf_peer.load_model(c, device, attn="sdpa", auto_class="AutoModelForImageTextToText",
                                                 lora_exclude=".*visual.*")
    print(f"hf_peer_vlm: loaded {c['model']} in {time.perf_counter() - t:.1f} s; {len(params)} LoRA tensors, "
          f"{sum(p.numel() for p in params)} parameters; {setup}")
    inner = model.get_base_model().model

    def rope_index(ids, ex):
        _, grid, types = ex
        if grid is None:
            return torch.arange(len(ids)).expand(3, -1)
        pos, _ = inner.get_rope_index(torch.tensor([ids]), types[None], image_grid_thw=grid)
        return pos[:, 0]

    from tokenizers import Tokenizer
    _, eos, pad = special_ids(c["model"], Tokenizer.from_file(os.path.join(c["model"], "tokenizer.json")))
    data = VlmBatches(samples, extras, pad if pad >= 0 else (eos if eos >= 0 else 0), c["seq_len"], c["batch"],
                      c["seed"], rope_index, c["data"])
    cache = {}

    def batch(step):  # built once per step on the CPU, outside the timed region; pinned for async copies
        if step not in cache:
            cache[step] = tuple(x.pin_memory() if cuda and torch.is_tensor(x) else x for x in data.batch(step))
        return cache[step]

    steps = args.steps or c["max_steps"] - args.warmup
    n_steps = max(c["max_steps"], args.max_warmup + steps)
    vcfg = json.load(open(os.path.join(c["model"], "config.json")))["vision_config"]
    for key in ("step_images", "step_image_tokens", "step_label_tokens", "step_matrix_flops"):
        res[key] = []
    for s in range(n_steps):
        b = batch(s)
        grids = b[5].tolist() if b[5] is not None else []
        res["step_images"].append(len(grids))
        res["step_label_tokens"].append(int((b[1] != -100).sum()))  # axengine's metrics: trainable_tokens
        res["step_image_tokens"].append(sum(t_ * h * w // 4 for t_, h, w in grids))
        res["step_matrix_flops"].append(flops.step_flops(c["model"], c["targets"], c["r"], spans(b[2][0]),
                                                         c["checkpointing"])["total"] + vision_flops(vcfg, grids))
    res.update(rows_packed=True, processor_s=round(t_proc, 2), corpus_images=n_images, conversations=len(samples),
               packed_rows=len(data.rows), processor=type(proc.image_processor).__name__)
    print(f"hf_peer_vlm: {len(samples)} conversations -> {len(data.rows)} rows of {c['seq_len']}; "
          f"images per step {res['step_images'][:8]}...")

    import peft
    import transformers
    res.update(versions={"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__},
               trainable_params=sum(p.numel() for p in params), setup=setup,
               lora_dtype=str(params[0].dtype).replace("torch.", ""), experts_implementation=None,
               attention="sdpa; packed rows, each sample attends to itself only (block-diagonal causal mask from "
                         "the text position_ids); the vision tower per image")
    layers = hf_peer.Layers(model, inner.language_model.layers)
    hf_peer.run_variants(res, variants, model, params, layers, batch, c, args, device, "", "sdpa", inputs=vlm_inputs)


if __name__ == "__main__":
    main()
