#!/usr/bin/env python3
"""A tiny image + text corpus for multimodal continued pre-training (the mm_cpt plugin, docs/plugins/mm_cpt.md):
natural-looking images (gradients, soft blobs, noise; JPEG, PNG and WebP of assorted odd sizes) and JSONL rows
whose text describes them, with one <image> placeholder per image. Deterministic for a given --seed.

  make-mm-corpus.py OUT_DIR [--rows 64] [--seed 0] [--shards 1] [--size WxH] [--one-image] [--jpeg]

writes OUT_DIR/images/*.{jpg,png,webp} and OUT_DIR/train.jsonl (or train-00000-of-0000N.jsonl with --shards),
rows as configs/qwen2_5-vl-mm-cpt.toml reads them: {"text": "...", "images": ["images/x.jpg", ...]}.
--size WxH makes every image that size (a benchmark corpus: bench/mm_cpt/run.sh), --one-image one image per row,
--jpeg JPEG only.
Needs numpy and Pillow (both in the venv scripts/setup.sh makes)."""
import argparse, json, os

import numpy as np
from PIL import Image

COLOURS = ["red", "green", "blue", "amber", "teal", "violet", "grey", "ochre"]
SHAPES = ["a soft blob", "two soft blobs", "a wide gradient", "a diagonal wash", "a bright spot"]


def natural(w, h, rng):
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    for c in range(3):
        a, b, p = rng.uniform(-1, 1, 3)
        img[..., c] = 128 + 80 * np.sin(a * x / w * 3 + b * y / h * 3 + p * 6)
    for _ in range(rng.integers(1, 6)):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(0.1, 0.4) * max(w, h)
        img += rng.uniform(-90, 90, 3) * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))[..., None]
    img += rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--size", default="", help="WxH: every image this size (default: odd sizes of 40-160 px)")
    ap.add_argument("--one-image", action="store_true", help="one image per row (default: 1 or 2)")
    ap.add_argument("--jpeg", action="store_true", help="JPEG only (default: JPEG, PNG and WebP)")
    a = ap.parse_args()
    fixed = tuple(int(x) for x in a.size.lower().split("x")) if a.size else None
    rng = np.random.default_rng(a.seed)
    os.makedirs(os.path.join(a.out, "images"), exist_ok=True)
    rows = []
    for i in range(a.rows):
        n_img = 1 if a.one_image else int(rng.choice([1, 1, 1, 2]))
        names, words = [], []
        for k in range(n_img):
            w, h = int(rng.integers(40, 160)), int(rng.integers(40, 160))
            ext = ["jpg", "png", "webp"][int(rng.integers(0, 3))]
            if fixed: w, h = fixed
            if a.jpeg: ext = "jpg"
            name = f"images/{i:05d}_{k}.{ext}"
            Image.fromarray(natural(w, h, rng)).save(os.path.join(a.out, name), **({"quality": 90} if ext != "png" else {}))
            names.append(name)
            words.append(f"{SHAPES[int(rng.integers(0, len(SHAPES)))]} in {COLOURS[int(rng.integers(0, len(COLOURS)))]}")
        if n_img == 1:
            text = f"<image>\nThis picture shows {words[0]}, {w} pixels wide."
        else:
            text = f"First <image> shows {words[0]}; then <image> shows {words[1]}."
        rows.append({"text": text, "images": names})
    per = (len(rows) + a.shards - 1) // a.shards
    for s in range(a.shards):
        name = "train.jsonl" if a.shards == 1 else f"train-{s:05d}-of-{a.shards:05d}.jsonl"
        with open(os.path.join(a.out, name), "w") as f:
            for r in rows[s * per:(s + 1) * per]:
                f.write(json.dumps(r) + "\n")
    print(f"wrote {len(rows)} rows to {a.out}")


if __name__ == "__main__":
    main()
