#!/usr/bin/env python3
"""Parity goldens for images in chat_template rows of Gemma 3 (docs/datasets.md, "Images in conversations").

plugins/mm_cpt/tests/data/chat_gemma3/ gets:
  model/      a model dir as the chat_template type reads it: config.json (model_type gemma3, mm_tokens_per_image 4,
              vision image_size 16), the mm_cpt test tokenizer with Gemma's turn and image tokens added, Gemma 3's chat
              template (tests/data/chat_templates/google-gemma-3-it.jinja) and preprocessor_config.json (16 x 16)
  openai.jsonl, sharegpt.jsonl   the conversations of make_mm_chat_goldens.py's generators (other seeds)
  goldens.jsonl   per row of openai.jsonl then sharegpt.jsonl: {"file", "input_ids", "labels", "n_images"}
  pixels.safetensors   pixel_values.<image file name>: transformers' fast processor's [3, 16, 16] of each image,
                       decoded as mm_cpt decodes it

input_ids are transformers' Gemma3Processor.apply_chat_template(conversation, tokenize=True, return_dict=True): the
template rendered, each <start_of_image> replaced by "\\n\\n<start_of_image>" + 4 x <image_soft_token> +
"<end_of_image>\\n\\n", tokenised. Labels follow the span rule of docs/datasets.md on the rendered text (as
make_mm_chat_goldens.py), shifted past the expansion; the image's tokens (start, soft, end) are -100.

Run with the project venv:  ~/.cache/axengine/venv/bin/python scripts/goldens/make_gemma3_chat_goldens.py
Versions used: transformers 5.23, tokenizers 0.23, torchvision 0.26 (scripts/requirements-goldens.txt).
"""
import json
import os
import random
import shutil
import sys

import tokenizers
import torch
import transformers
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer
from transformers import Gemma3ImageProcessor, Gemma3Processor, PreTrainedTokenizerFast
from PIL import Image, ImageOps
from transformers.image_transforms import convert_to_rgb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_mm_chat_goldens import (DATA, IMAGES, MARKERS, ROOT, absolute, assistant_spans, conversation,  # noqa: E402
                                  expanded_labels, sharegpt, sharegpt_to_messages)

OUT = os.path.join(DATA, "chat_gemma3")
MODEL = os.path.join(OUT, "model")
TEMPLATE = os.path.join(ROOT, "tests", "data", "chat_templates", "google-gemma-3-it.jinja")
SIZE, TOKENS = 16, 4
BOI, EOI, SOFT = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
SPECIALS = ["<bos>", "<start_of_turn>", "<end_of_turn>", BOI, EOI, SOFT]
EXPANSION = "\n\n" + BOI + SOFT * TOKENS + EOI + "\n\n"


def make_model():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(MODEL)
    tok = Tokenizer.from_file(os.path.join(DATA, "tokenizer", "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.save(os.path.join(MODEL, "tokenizer.json"))
    with open(os.path.join(DATA, "tokenizer", "tokenizer_config.json")) as f:
        tc = json.load(f)
    tc["bos_token"] = "<bos>"
    with open(os.path.join(MODEL, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=1)
    shutil.copy(TEMPLATE, os.path.join(MODEL, "chat_template.jinja"))
    with open(os.path.join(MODEL, "config.json"), "w") as f:
        json.dump({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "mm_tokens_per_image": TOKENS,
                   "vision_config": {"model_type": "siglip_vision_model", "image_size": SIZE, "patch_size": 2}}, f, indent=1)
    with open(os.path.join(MODEL, "preprocessor_config.json"), "w") as f:
        json.dump({"image_processor_type": "Gemma3ImageProcessor", "size": {"height": SIZE, "width": SIZE}}, f, indent=1)
    return tok


def main():
    assert transformers.__version__ == "5.23.0" and tokenizers.__version__.startswith("0.23"), "pinned peers expected"
    raw_tok = make_model()
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(MODEL, "tokenizer.json"), bos_token="<bos>",
                                     eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                     extra_special_tokens={"boi_token": BOI, "eoi_token": EOI, "image_token": SOFT})
    with open(TEMPLATE) as f:
        template = f.read()
    proc = Gemma3Processor(image_processor=Gemma3ImageProcessor(size={"height": SIZE, "width": SIZE}), tokenizer=hf_tok,
                           chat_template=template, image_seq_length=TOKENS)
    image_ids = {raw_tok.token_to_id(t) for t in (BOI, EOI, SOFT)}
    rng = random.Random(41)
    openai = [conversation(rng, i) for i in range(48)]
    share = [sharegpt(rng) for _ in range(16)]
    goldens = []
    for name, rows, to_messages in (("openai.jsonl", openai, lambda r: r["messages"]), ("sharegpt.jsonl", share, sharegpt_to_messages)):
        for row in rows:
            messages = to_messages(row)
            conv = absolute(messages, OUT)
            text = proc.apply_chat_template(conv, tokenize=False)
            out = proc.apply_chat_template(conv, tokenize=True, return_dict=True)
            ids = list(out["input_ids"][0])
            n_images = len(out["pixel_values"]) if "pixel_values" in out else 0
            spans = assistant_spans(text.encode(), messages, [m.encode() for m in MARKERS])
            # The processor's expansion: every BOI becomes EXPANSION.
            labels = expanded_labels(raw_tok, text.encode(), BOI.encode(), [EXPANSION.encode()] * n_images, spans, ids,
                                     image_ids)
            goldens.append({"file": name, "input_ids": ids, "labels": labels, "n_images": n_images})
        with open(os.path.join(OUT, name), "w") as f:
            for row in rows:
                f.write(json.dumps(row, sort_keys=True) + "\n")
    with open(os.path.join(OUT, "goldens.jsonl"), "w") as f:
        for g in goldens:
            f.write(json.dumps(g) + "\n")
    ip = Gemma3ImageProcessor(size={"height": SIZE, "width": SIZE})
    pixels = {}
    for name in IMAGES + ["d.webp", "g_palette.png"]:
        # The decoded image as mm_cpt's decoder makes it (EXIF orientation, alpha over white: make_mm_goldens.py's
        # load_like_transformers); transformers 5.23's load_image drops alpha instead (convert("RGB")).
        img = convert_to_rgb(ImageOps.exif_transpose(Image.open(os.path.join(DATA, "images", name))))
        pixels["pixel_values." + name] = ip(images=[img], return_tensors="pt")["pixel_values"][0].contiguous()
    save_file(pixels, os.path.join(OUT, "pixels.safetensors"))
    n_img = sum(g["n_images"] for g in goldens)
    print("wrote", OUT, len(goldens), "conversations,", n_img, "images,", sum(1 for g in goldens if not g["n_images"]), "text-only")


if __name__ == "__main__":
    main()
