#!/usr/bin/env python3
"""transformers' fast image processor of one family (torchvision backend) on the same images as mm_processor_bench:
decode (PIL, as transformers' load_image) + process, images/s. One JSON line.
  processor_bench.py <dir of images> [images=256] [threads=0 (torch's default)] [family=qwen2_vl]
Families, with the hub checkpoints' preprocessor_config.json settings (processor_bench.cpp sets the same):
  qwen2_vl  Qwen2VLImageProcessor() (Qwen2-VL / Qwen2.5-VL: patch 14, min 3136, max 1003520 pixels)
  qwen3_vl  Qwen2VLImageProcessor as Qwen3-VL's hub config makes it: patch 16, mean / std 0.5, shortest_edge 65536,
            longest_edge 16777216 pixels (Qwen3VLProcessor's image processor)
  gemma3    Gemma3ImageProcessor at 896 x 896 (Gemma 3 4b/12b/27b; bilinear, mean / std 0.5, no pan-and-scan)
Make the images with: processor_bench.py --make <dir> (16 natural-looking 640x480 JPEGs).
The lead-runnable commands for the 16-core GPU host: processor_bench.cpp's header."""
import json, os, sys, time

from PIL import Image


def make(d):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../scripts/goldens"))
    from make_mm_goldens import natural
    os.makedirs(d, exist_ok=True)
    for i in range(16):
        Image.fromarray(natural(640, 480, 100 + i)).save(os.path.join(d, f"{i:02d}.jpg"), quality=90)


def processor(family):
    from transformers import Gemma3ImageProcessor, Qwen2VLImageProcessor
    if family == "qwen2_vl":
        return Qwen2VLImageProcessor()
    if family == "qwen3_vl":
        return Qwen2VLImageProcessor(patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                     size={"shortest_edge": 65536, "longest_edge": 16777216})
    if family == "gemma3":
        return Gemma3ImageProcessor(size={"height": 896, "width": 896})
    sys.exit(f"processor_bench.py: unknown family {family!r} (qwen2_vl, qwen3_vl, gemma3)")


def main():
    if sys.argv[1] == "--make":
        return make(sys.argv[2])
    import torch
    from transformers.image_utils import load_image
    d = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    if len(sys.argv) > 3 and int(sys.argv[3]) > 0:
        torch.set_num_threads(int(sys.argv[3]))
    family = sys.argv[4] if len(sys.argv) > 4 else "qwen2_vl"
    paths = sorted(os.path.join(d, f) for f in os.listdir(d))
    proc = processor(family)
    batch = 16  # images per call, as a data loader would pass them

    def run():
        for s in range(0, n, batch):
            imgs = [load_image(paths[i % len(paths)]) for i in range(s, min(n, s + batch))]
            proc(images=imgs, return_tensors="pt")

    run()
    t0 = time.perf_counter()
    run()
    sec = time.perf_counter() - t0
    print(json.dumps({"bench": f"transformers {type(proc).__name__} (fast)", "family": family, "images": n,
                      "threads": torch.get_num_threads(), "seconds": round(sec, 4), "images_per_s": round(n / sec, 1)}))


if __name__ == "__main__":
    main()
