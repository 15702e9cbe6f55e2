#!/usr/bin/env python3
"""The VLM SFT bench's result: bench/train_step/summarize.py's JSON (axengine's row from its run, the peer's rows,
ratios, MFU, same_tokens_per_step, device, date, command) made by run.sh, completed here with what is particular
to image conversations: images/s per row (the mean images of the row's timed steps over its median step time;
both sides train the same steps), same_label_tokens_per_step (the peer's assistant-only labels count as many
tokens as axengine's trainable_tokens in every step: the same loss mask), the workload (conversations, images, image tokens per step), the goal of issue
40 (axengine's step at most 0.5x HF transformers + peft's), and the Markdown next to it rewritten.

usage: summarize_vlm.py RESULT.json PEER.json CORPUS_STATS.json AXENGINE_METRICS.jsonl
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train_step"))
import summarize  # noqa: E402

GOALS = {"ratio_vs_hf_eager_max": 0.5, "note": "issue 40 item 4: a Qwen3-VL-8B-shaped SFT step on conversations with "
         "1-4 images at <= 0.5x HF transformers + peft's step time (H200, same run)"}


def timed_range(row):
    """The batch indices of a row's timed steps: axengine's [warm-up, ...) from summarize.py, the peer's after
    its warm-up."""
    if row.get("timed_steps"):
        return row["timed_steps"]
    if row.get("steps_timed"):
        return [row["warmup_steps"], row["warmup_steps"] + row["steps_timed"]]
    return None


def shape(model_dir):
    """The model's shape in words, from its config.json (TINY=1 runs the tiny preset's)."""
    try:
        c = json.load(open(os.path.join(model_dir, "config.json")))
    except (OSError, TypeError, ValueError):
        return "Qwen3-VL"
    t, v = c["text_config"], c["vision_config"]
    return (f"Qwen3-VL, decoder {t['num_hidden_layers']} layers of hidden {t['hidden_size']} "
            f"({t['num_attention_heads']}/{t['num_key_value_heads']} heads, intermediate {t['intermediate_size']}), "
            f"vision {v['depth']} blocks of hidden {v['hidden_size']}, deepstack {v.get('deepstack_visual_indexes')}")


def main():
    out, peer_path, stats_path, metrics = sys.argv[1:5]
    res = json.load(open(out))
    try:
        peer = json.load(open(peer_path))
    except (OSError, ValueError):  # the peer failed before its first row: summarize.py's rows say so
        peer = {}
    stats = json.load(open(stats_path))
    images, image_tokens = peer.get("step_images", []), peer.get("step_image_tokens", [])
    for row in res["rows"]:
        rng = timed_range(row)
        if row.get("ms_per_step") and rng and images[rng[0]:rng[1]]:
            per_step = statistics.fmean(images[rng[0]:rng[1]])
            row["images_per_step"] = round(per_step, 2)
            row["images_per_s"] = round(per_step / (row["ms_per_step"] / 1e3), 1)
    try:
        ax = [json.loads(l)["trainable_tokens"] for l in open(metrics) if '"trainable_tokens"' in l]
    except OSError:
        ax = []
    hf = peer.get("step_label_tokens", [])
    n = min(len(ax), len(hf))
    res["same_label_tokens_per_step"] = {"hf+peft": ax[:n] == hf[:n]} if n else {}
    B, S = peer.get("batch") or (None, None)
    res["bench"] = (f"vlm_sft step: {shape(peer.get('model'))} (random init, bf16), LoRA r=16 on the language model's "
                    f"attention + MLP, frozen vision tower, image conversations (1-4 JPEGs of "
                    f"{stats['side_px'][0]}-{stats['side_px'][1]} px each) packed into {B} x {S} tokens")
    if not res["axengine_profile"].get("line") and "not profiled" in res["axengine_profile"].get("note", ""):
        res["axengine_profile"]["note"] = "not profiled (PROFILE=1 bash bench/vlm_sft/run.sh profiles axengine)"
    res["goals"] = GOALS
    res["workload"] = {
        "corpus": stats, "conversations": peer.get("conversations"), "packed_rows": peer.get("packed_rows"),
        "images_per_step_mean": round(statistics.fmean(images), 2) if images else None,
        "image_tokens_per_step_mean": round(statistics.fmean(image_tokens)) if image_tokens else None,
        "hf_processor": peer.get("processor"), "hf_processor_s": peer.get("processor_s"),
        "note": "the peer's processor time (every image decoded and processed before training) is outside its "
                "step times, as axengine's prepare is outside its"}
    res["method"] += (" images_per_s: the mean images of a row's timed steps over its ms_per_step (the same "
                      "steps on both sides).")
    json.dump(res, open(out, "w"), indent=1)
    md = summarize.markdown(res)
    md += "\n| system | images/s | images/step |\n|---|---|---|\n" + "".join(
        f"| {r['system']} | {r.get('images_per_s', '')} | {r.get('images_per_step', '')} |\n" for r in res["rows"])
    md += (f"\nsame_label_tokens_per_step: {json.dumps(res['same_label_tokens_per_step'])}\n"
           f"\nworkload: {json.dumps(res['workload'])}\n")
    open(out.rsplit(".json", 1)[0] + ".md", "w").write(md)
    print(md)


if __name__ == "__main__":
    main()
