#!/usr/bin/env python3
"""transformers' fast Qwen2-VL processor (torchvision backend) on the same images as mm_processor_bench:
decode (PIL, as transformers' load_image) + process, images/s. One JSON line.
  processor_bench.py <dir of images> [images=256] [threads=0 (torch's default)]
Make the images with: processor_bench.py --make <dir> (16 natural-looking 640x480 JPEGs)."""
import json, os, sys, time

import numpy as np
from PIL import Image


def make(d):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../scripts/goldens"))
    from make_mm_goldens import natural
    os.makedirs(d, exist_ok=True)
    for i in range(16):
        Image.fromarray(natural(640, 480, 100 + i)).save(os.path.join(d, f"{i:02d}.jpg"), quality=90)


def main():
    if sys.argv[1] == "--make":
        return make(sys.argv[2])
    import torch
    from transformers import Qwen2VLImageProcessor
    from transformers.image_utils import load_image
    d = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    if len(sys.argv) > 3 and int(sys.argv[3]) > 0:
        torch.set_num_threads(int(sys.argv[3]))
    paths = sorted(os.path.join(d, f) for f in os.listdir(d))
    proc = Qwen2VLImageProcessor()
    batch = 16  # images per call, as a data loader would pass them

    def run():
        for s in range(0, n, batch):
            imgs = [load_image(paths[i % len(paths)]) for i in range(s, min(n, s + batch))]
            proc(images=imgs, return_tensors="pt")

    run()
    t0 = time.perf_counter()
    run()
    sec = time.perf_counter() - t0
    print(json.dumps({"bench": "transformers Qwen2VLImageProcessor (fast)", "images": n,
                      "threads": torch.get_num_threads(), "seconds": round(sec, 4), "images_per_s": round(n / sec, 1)}))


if __name__ == "__main__":
    main()
