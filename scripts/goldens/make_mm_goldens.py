#!/usr/bin/env python3
"""Goldens of the mm_cpt plugin (plugins/mm_cpt/tests/data/), made with transformers' fast Qwen2-VL processor.

- images/: small natural-looking images (smooth gradients, blobs, noise) of odd sizes as JPEG, PNG (incl. one
  with alpha, one greyscale, one palette) and WebP (lossy, lossless), and a JPEG with EXIF orientation 6;
- processor_goldens.safetensors: for each image, the pixels transformers' loader decodes (PIL, exif_transpose,
  convert_to_rgb) as `decoded.<name>` uint8 [H, W, 3], and Qwen2VLImageProcessor's (torchvision backend)
  `pixel_values.<name>` / `grid.<name>` for each processor setting in SETTINGS;
- tokenizer/: the committed Qwen2 tokenizer with Qwen2.5-VL's vision tokens added;
- processor_goldens_qwen3_vl.safetensors (`make_mm_goldens.py qwen3_vl`: from the committed images, which it
  leaves as they are): the same processor with Qwen3-VL's settings (patch 16, so factor 32; mean and std 0.5,
  as the hub's preprocessor_config.json) for each of QWEN3_VL_SETTINGS, the settings as JSON metadata.

Run from the repository root with the venv's python (needs torchvision==0.26.0, scripts/requirements-goldens.txt).
"""
import io, json, os, pathlib, shutil, sys

import numpy as np
import torch
from PIL import Image, ImageOps
from safetensors.torch import save_file
from transformers import Qwen2VLImageProcessor
from transformers.image_transforms import convert_to_rgb

root = pathlib.Path(__file__).resolve().parents[2]
out = root / "plugins/mm_cpt/tests/data"
img_dir = out / "images"

# (min_pixels, max_pixels): the defaults scaled down (small images upscale), and a tight max that downscales.
SETTINGS = {"a": (28 * 28 * 4, 28 * 28 * 16), "b": (28 * 28 * 2, 28 * 28 * 6)}
QWEN3_VL_SETTINGS = {
    key: dict(min_pixels=lo, max_pixels=hi, patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    for key, (lo, hi) in {"a": (32 * 32 * 4, 32 * 32 * 8)}.items()}  # small images scale up, large ones down


def natural(w, h, seed):
    """A photo-like RGB array: smooth colour gradients, a few soft blobs, fine sensor-like noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    for c in range(3):
        a, b, p = rng.uniform(-1, 1, 3)
        img[..., c] = 128 + 80 * np.sin(a * x / w * 3 + b * y / h * 3 + p * 6)
    for _ in range(5):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(0.1, 0.4) * max(w, h)
        col = rng.uniform(-90, 90, 3)
        img += col * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))[..., None]
    img += rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def make_images():
    if img_dir.exists():
        shutil.rmtree(img_dir)
    img_dir.mkdir(parents=True)
    Image.fromarray(natural(97, 61, 1)).save(img_dir / "a.jpg", quality=88)
    Image.fromarray(natural(33, 150, 2)).save(img_dir / "b.png")
    Image.fromarray(natural(121, 89, 3)).save(img_dir / "c.webp", quality=80)
    Image.fromarray(natural(57, 43, 4)).save(img_dir / "d.webp", lossless=True)
    rgba = np.concatenate([natural(45, 71, 5), np.linspace(0, 255, 45 * 71).reshape(71, 45, 1).astype(np.uint8)], 2)
    Image.fromarray(rgba, "RGBA").save(img_dir / "e_alpha.png")
    Image.fromarray(natural(64, 50, 6)[..., 1]).save(img_dir / "f_grey.png")
    Image.fromarray(natural(70, 39, 7)).quantize(64).save(img_dir / "g_palette.png")
    Image.fromarray(natural(40, 40, 8)[..., 0]).save(img_dir / "h_grey.jpg", quality=92)
    # Stored 83 wide x 52 high; EXIF orientation 6 (rotate 90 degrees clockwise to view): 52 x 83 upright.
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(natural(83, 52, 9)).save(img_dir / "i_exif6.jpg", quality=90, exif=exif.tobytes())
    Image.fromarray(natural(300, 200, 10)).save(img_dir / "j_large.jpg", quality=85)
    Image.fromarray(natural(13, 11, 11)).save(img_dir / "k_tiny.png")


def load_like_transformers(path):
    """transformers' load_image: PIL open, exif_transpose, then convert_to_rgb (alpha over white)."""
    im = ImageOps.exif_transpose(Image.open(path))
    return convert_to_rgb(im, return_numpy=True)


def processor_goldens(settings, tensors, file):
    """Each committed image through Qwen2VLImageProcessor with each setting's keyword arguments."""
    for p in sorted(img_dir.iterdir()):
        rgb = load_like_transformers(p)
        for key, kw in settings.items():
            r = Qwen2VLImageProcessor(**kw)(images=[rgb], return_tensors="pt")
            tensors[f"pixel_values.{key}.{p.name}"] = r["pixel_values"].contiguous()
            tensors[f"grid.{key}.{p.name}"] = r["image_grid_thw"].contiguous()
    save_file(tensors, str(out / file), metadata={k: json.dumps(v) for k, v in settings.items()})
    print("wrote", out / file, len(tensors), "tensors")


def main():
    if sys.argv[1:] == ["qwen3_vl"]:
        processor_goldens(QWEN3_VL_SETTINGS, {}, "processor_goldens_qwen3_vl.safetensors")
        return
    make_images()
    tensors = {}
    for p in sorted(img_dir.iterdir()):
        name = p.name
        rgb = load_like_transformers(p)
        tensors[f"decoded.{name}"] = torch.from_numpy(np.ascontiguousarray(rgb))
        for key, (lo, hi) in SETTINGS.items():
            proc = Qwen2VLImageProcessor(min_pixels=lo, max_pixels=hi)
            r = proc(images=[rgb], return_tensors="pt")
            tensors[f"pixel_values.{key}.{name}"] = r["pixel_values"].contiguous()
            tensors[f"grid.{key}.{name}"] = r["image_grid_thw"].contiguous()
    meta = {k: json.dumps(v) for k, v in SETTINGS.items()}
    save_file(tensors, str(out / "processor_goldens.safetensors"), metadata=meta)

    from tokenizers import Tokenizer, AddedToken
    tok = Tokenizer.from_file(str(root / "tests/data/tokenizers/transformers_qwen2/tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")])
    (out / "tokenizer").mkdir(exist_ok=True)
    tok.save(str(out / "tokenizer/tokenizer.json"))
    shutil.copy(root / "tests/data/tokenizers/transformers_qwen2/tokenizer_config.json", out / "tokenizer/")  # EOS
    print("wrote", out, len(tensors), "tensors")


if __name__ == "__main__":
    main()
