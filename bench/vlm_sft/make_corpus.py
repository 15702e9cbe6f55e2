#!/usr/bin/env python3
"""Image conversations for the VLM SFT step benchmark (bench/vlm_sft/run.sh): OpenAI-style `messages` rows as
axengine's chat_template type and transformers' processor.apply_chat_template both read them
(docs/datasets.md, "Images in conversations").

Each conversation: an optional system prompt (30 %), 1-3 user/assistant turns, and 1-4 images (1: 40 %, 2: 30 %,
3: 15 %, 4: 15 %) as {"type": "image", "image": "images/NAME.jpg"} parts of the user turns (the first turn holds
at least one; images before the question, as people write them). Images: natural-looking JPEGs (quality 90) of
scripts/make-mm-corpus.py's generator (gradients, soft blobs, noise; drawn at half size and resized up, which
keeps them smooth and makes them 4x faster to draw), each side uniform in [--min-side, --max-side] (448-1024 px by
default: 196 to 1,024 image tokens each with Qwen3-VL-8B's processor). Text: sentences of a small word bank,
lengths drawn in tokens of the model's tokenizer (a user turn 15-120, an assistant turn 40-450, log-uniform) and
written at --chars-per-token characters per token (1.3: the tiny preset's byte-level BPE, which the bench model
uses; a real Qwen tokenizer makes ~4 characters a token, so the same token counts hold about 3x the words).
Deterministic for a given --seed; images are drawn in parallel (--jobs).

  make_corpus.py OUT_DIR [--rows 160] [--seed 0] [--min-side 448] [--max-side 1024] [--text-scale 1]
                 [--jobs 0 (all cores)]

writes OUT_DIR/train.jsonl, OUT_DIR/images/*.jpg and OUT_DIR/stats.json (rows, images per row, sizes)."""
import argparse
import importlib.util
import json
import math
import os
from multiprocessing import Pool

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("make_mm_corpus", os.path.join(HERE, "..", "..", "scripts", "make-mm-corpus.py"))
_mm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mm)

NOUNS = ("kettle table window chart street bicycle receipt dog garden screen label shelf bridge river sign menu "
         "painting diagram bottle jacket lamp field building car tree map form keyboard plate cup").split()
ADJ = ("red small wooden bright dark blue old large round empty crowded narrow soft green striped tall").split()
VERBS = ("shows", "holds", "leans against", "sits beside", "covers", "points to", "hangs above", "reflects", "crosses",
         "faces")
GLUE = ("the a this that its each".split(), "and but while because so although".split())
QUESTIONS = ("What is in this image", "Describe the scene in detail", "How many objects can you count",
             "What colour is the main object", "Compare the two pictures", "What text appears here",
             "Is anything unusual in the photo", "Summarise what the chart says")


def sentence(rng):
    words = [rng.choice(GLUE[0]).capitalize(), rng.choice(ADJ), rng.choice(NOUNS), rng.choice(VERBS),
             rng.choice(GLUE[0]), rng.choice(NOUNS)]
    if rng.random() < 0.6:
        words += [rng.choice(GLUE[1]), rng.choice(GLUE[0]), rng.choice(ADJ), rng.choice(NOUNS), rng.choice(VERBS),
                  "the", rng.choice(NOUNS)]
    if rng.random() < 0.2:
        words.append(f"at {int(rng.integers(1, 400))} cm")
    return " ".join(words) + "."


def text(rng, lo, hi, cpt, head=""):
    """Sentences until the drawn token count (log-uniform in [lo, hi]) times cpt characters."""
    chars = math.exp(rng.uniform(math.log(lo), math.log(hi))) * cpt
    out = head
    while len(out) < chars:
        out += (" " if out else "") + sentence(rng)
    return out


def draw(job):
    """One JPEG: (path, width, height, seed)."""
    path, w, h, seed = job
    small = _mm.natural(max(w // 2, 8), max(h // 2, 8), np.random.default_rng(seed))
    Image.fromarray(small).resize((w, h), Image.BICUBIC).save(path, quality=90)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--rows", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-side", type=int, default=448)
    ap.add_argument("--max-side", type=int, default=1024)
    ap.add_argument("--chars-per-token", type=float, default=1.3)
    ap.add_argument("--text-scale", type=float, default=1.0, help="turn lengths times this (TINY=1: short rows)")
    ap.add_argument("--jobs", type=int, default=0)
    a = ap.parse_args()
    if not 16 <= a.min_side <= a.max_side:
        ap.error("need 16 <= --min-side <= --max-side")
    rng, ts = np.random.default_rng(a.seed), a.text_scale
    os.makedirs(os.path.join(a.out, "images"), exist_ok=True)
    rows, jobs = [], []
    for i in range(a.rows):
        n_img = int(rng.choice([1, 2, 3, 4], p=[0.4, 0.3, 0.15, 0.15]))
        turns = int(rng.integers(1, 4))
        # Images per turn: the first turn at least one, the rest spread over the turns at random.
        per_turn = [1] + [0] * (turns - 1)
        for _ in range(n_img - 1):
            per_turn[int(rng.integers(0, turns))] += 1
        messages = []
        if rng.random() < 0.3:
            messages.append({"role": "system", "content": text(rng, 10 * ts, 40 * ts, a.chars_per_token, "You are a careful visual assistant.")})
        k = 0
        for t in range(turns):
            parts = []
            for _ in range(per_turn[t]):
                w, h = (int(rng.integers(a.min_side, a.max_side + 1)) for _ in range(2))
                name = f"images/{i:05d}_{k}.jpg"
                jobs.append((os.path.join(a.out, name), w, h, a.seed * 1000003 + i * 8 + k))
                parts.append({"type": "image", "image": name})
                k += 1
            q = rng.choice(QUESTIONS) + "?" if rng.random() < 0.7 else ""
            parts.append({"type": "text", "text": text(rng, 15 * ts, 120 * ts, a.chars_per_token, q)})
            messages.append({"role": "user", "content": parts if per_turn[t] else parts[0]["text"]})
            messages.append({"role": "assistant", "content": text(rng, 40 * ts, 450 * ts, a.chars_per_token)})
        rows.append({"messages": messages})
    with Pool(a.jobs or os.cpu_count()) as pool:
        pool.map(draw, jobs, chunksize=4)
    with open(os.path.join(a.out, "train.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    counts = [sum(1 for m in r["messages"] if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image")
              for r in rows]
    sides = [s for j in jobs for s in j[1:3]]
    stats = {"rows": len(rows), "images": len(jobs), "images_per_row": {str(n): counts.count(n) for n in (1, 2, 3, 4)},
             "side_px": [min(sides), max(sides)], "seed": a.seed, "chars_per_token": a.chars_per_token}
    json.dump(stats, open(os.path.join(a.out, "stats.json"), "w"), indent=1)
    print(f"make_corpus: {json.dumps(stats)} -> {a.out}")


if __name__ == "__main__":
    main()
