#!/usr/bin/env python3
"""Parity goldens for images in chat_template rows (docs/datasets.md, "Images in conversations"), Qwen2.5-VL and
Qwen3-VL.

plugins/mm_cpt/tests/data/chat/ gets:
  model/      a model dir as the chat_template type reads it: config.json (model_type qwen2_5_vl), the mm_cpt test
              tokenizer (tokenizer/, Qwen2 + vision tokens) with <|im_start|> / <|im_end|> added, Qwen2.5-VL's chat
              template (tests/data/chat_templates/Qwen-Qwen2.5-VL-7B-Instruct.jinja) and a preprocessor_config.json
              with small pixel bounds (the image processor's other settings are transformers' defaults)
  openai.jsonl    conversations with content parts: {"type": "image", "image": PATH} and {"type": "image_url", ...},
                  paths relative to the file (the committed images of ../images/), some file://
  sharegpt.jsonl  ShareGPT rows ({"conversations": [{"from", "value"}], "images": [...]}) with <image> placeholders
  goldens.jsonl   per row of openai.jsonl then sharegpt.jsonl: {"file", "input_ids", "labels", "grid"}

input_ids and image_grid_thw are transformers' Qwen2_5_VLProcessor.apply_chat_template(conversation, tokenize=True,
return_dict=True) (the template rendered, each <|image_pad|> expanded to grid_t*grid_h*grid_w/merge^2 pads, then
tokenised). The template has no {% generation %} blocks, so transformers gives no assistant mask; labels follow the
span rule of docs/datasets.md on the rendered text (assistant_spans below, as make_chat_dataset_goldens.py does, over
a content's text parts), shifted past the expansion, marked with HF tokenizers' offsets; image tokens -100. A
ShareGPT row is the same conversation with each <image> made an image part, in order.

plugins/mm_cpt/tests/data/chat_qwen3_vl/ (`make_mm_chat_goldens.py qwen3_vl`) gets the same for Qwen3-VL on the same
conversations (chat/openai.jsonl, chat/sharegpt.jsonl): model/ with model_type qwen3_vl, Qwen3-VL's chat template
(tests/data/chat_templates/Qwen-Qwen3-VL-8B-Instruct.jinja) and the hub's processor settings (patch 16, mean and std
0.5) with small pixel bounds; goldens.jsonl from transformers' Qwen3VLProcessor.apply_chat_template.

Run with the project venv:  /root/.cache/axengine/venv/bin/python scripts/goldens/make_mm_chat_goldens.py [qwen3_vl]
Versions used: transformers 5.23, tokenizers 0.23, torchvision 0.26 (scripts/requirements-goldens.txt).
"""
import json
import os
import random
import shutil
import sys

import tokenizers
import transformers
from tokenizers import AddedToken, Tokenizer
from transformers import (PreTrainedTokenizerFast, Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor,
                          Qwen3VLProcessor, Qwen3VLVideoProcessor)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DATA = os.path.join(ROOT, "plugins", "mm_cpt", "tests", "data")
OUT = os.path.join(DATA, "chat")
TEMPLATES = os.path.join(ROOT, "tests", "data", "chat_templates")
IMAGES = ["a.jpg", "b.png", "e_alpha.png", "f_grey.png", "h_grey.jpg", "i_exif6.jpg", "k_tiny.png", "j_large.jpg", "c.webp"]
# Per family: the output dir, config.json's model_type and architecture, the template, the image processor's
# settings (preprocessor_config.json's and the processor's) and the transformers processor classes.
FAMILIES = {
    "qwen2_5_vl": dict(out=OUT, model_type="qwen2_5_vl", arch="Qwen2_5_VLForConditionalGeneration",
                       template="Qwen-Qwen2.5-VL-7B-Instruct.jinja",
                       image=dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 12, patch_size=14),
                       processor=Qwen2_5_VLProcessor, video=Qwen2VLVideoProcessor),
    "qwen3_vl": dict(out=os.path.join(DATA, "chat_qwen3_vl"), model_type="qwen3_vl", arch="Qwen3VLForConditionalGeneration",
                     template="Qwen-Qwen3-VL-8B-Instruct.jinja",
                     image=dict(min_pixels=32 * 32 * 4, max_pixels=32 * 32 * 12, patch_size=16, image_mean=[0.5] * 3,
                                image_std=[0.5] * 3),
                     processor=Qwen3VLProcessor, video=Qwen3VLVideoProcessor),
}
MARKERS = ["<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "</s>", "<|end|>", "<|return|>", "<|endoftext|>"]
WS = b" \t\n\r\f\v"
PAD = "<|image_pad|>"

WORDS = ("the picture shows a red blob on a soft gradient; what colour is it? describe the shapes, count the spots, "
         "is it bright or dark, left or right, and why. numbers 12 7 and 300 appear too").split()


def pieces(m):
    c = m.get("content")
    if isinstance(c, str):
        return [c]
    if isinstance(c, list):
        return [p["text"] for p in c if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)]
    return []


def assistant_spans(text, messages, markers):
    """The span rule (data/chat_template.hpp find_assistant_spans) on UTF-8 bytes, over each content's pieces."""
    spans, cursor = [], 0
    for m in messages:
        assistant = m.get("role") == "assistant"
        first = None
        for content in pieces(m):
            needle = content.encode()
            at = text.find(needle, cursor) if needle else -1
            if at < 0:
                needle = needle.strip(WS)
                at = text.find(needle, cursor) if needle else -1
            if at < 0:
                assert not (assistant and needle), "assistant content not found"
                continue
            first = at if first is None else first
            cursor = at + len(needle)
        if not assistant or first is None:
            continue
        best = max([len(k) for k in markers if text.startswith(k, cursor)], default=0)
        spans.append((first, cursor + best))
        cursor += best
    return spans


def expanded_labels(raw_tok, raw, placeholder, replacements, spans, ids, image_ids):
    """The processor's expansion redone on the rendered text `raw` (bytes): the k-th `placeholder` becomes
    replacements[k] and the assistant `spans` shift with it. Checks that `ids` are the expanded text's tokens and
    returns their labels by the span rule (a token overlapping a span is labelled); image tokens are always -100."""
    expanded, growth, at = b"", [], 0  # growth: (placeholder position, total growth up to and including it)
    for rep in replacements:
        p = raw.find(placeholder, at)
        assert p >= 0, "fewer placeholders than images"
        expanded += raw[at:p] + rep
        growth.append((p, len(rep) - len(placeholder) + (growth[-1][1] if growth else 0)))
        at = p + len(placeholder)
    assert raw.find(placeholder, at) < 0, "more placeholders than images"
    expanded += raw[at:]

    def shift(x):
        g = 0
        for p, total in growth:
            if p < x:
                g = total
        return x + g
    spans = [(shift(a), shift(b)) for a, b in spans]
    enc = raw_tok.encode(expanded.decode(), add_special_tokens=False)
    assert enc.ids == ids, "the processor's ids are the expanded text's"
    # HF offsets are character offsets: convert to UTF-8 byte offsets.
    byte_at = [0]
    for ch in expanded.decode():
        byte_at.append(byte_at[-1] + len(ch.encode()))
    labels = []
    for tid, (b, e) in zip(enc.ids, enc.offsets):
        b, e = byte_at[b], byte_at[e]
        inside = any(b < se and e > sb for sb, se in spans)
        labels.append(tid if inside and tid not in image_ids else -100)
    return labels


def words(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def image_part(rng, name):
    """One image part in one of the spellings a row may use (relative to the data file)."""
    rel = "../images/" + name
    k = rng.randrange(4)
    if k == 0:
        return {"type": "image", "image": rel}
    if k == 1:
        return {"type": "image_url", "image_url": {"url": rel}}
    if k == 2:
        return {"type": "image", "image": "file://" + rel}
    return {"type": "image", "url": rel}


def conversation(rng, i):
    messages = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": words(rng, 2, 8) + "."})
    turns = rng.randint(1, 3)
    images_left = rng.choice([0, 0, 1, 1, 2, 3])
    for t in range(turns):
        n = images_left if t == turns - 1 else rng.randint(0, images_left)
        images_left -= n
        if n == 0 and rng.random() < 0.5:
            messages.append({"role": "user", "content": words(rng, 2, 10) + "?"})
        else:
            parts = [{"type": "text", "text": words(rng, 1, 6)} for _ in range(rng.randint(1, 2))]
            for _ in range(n):  # images before, between or after the text parts
                parts.insert(rng.randint(0, len(parts)), image_part(rng, rng.choice(IMAGES)))
            messages.append({"role": "user", "content": parts})
        reply = words(rng, 1, 12) + "."
        messages.append({"role": "assistant", "content": reply if rng.random() < 0.8 else [{"type": "text", "text": reply}]})
    return {"messages": messages}


def sharegpt(rng):
    conv, images = [], []
    if rng.random() < 0.3:
        conv.append({"from": "system", "value": words(rng, 2, 6) + "."})
    for t in range(rng.randint(1, 2)):
        text = words(rng, 1, 8)
        for _ in range(rng.choice([0, 1, 1, 2])):
            at = rng.choice([0, len(text)])
            text = text[:at] + ("<image>\n" if at == 0 else "\n<image>") + text[at:]
            images.append("../images/" + rng.choice(IMAGES))
        conv.append({"from": "human", "value": text})
        conv.append({"from": "gpt", "value": words(rng, 1, 10) + "."})
    # Placeholders are numbered in text order: the images list follows the order they appear.
    row = {"conversations": conv}
    if images:
        row["images"] = images
    return row


def sharegpt_to_messages(row):
    """As the chat_template type reads a ShareGPT row: each <image> becomes an image part, in order."""
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    images = list(row.get("images", []))
    out = []
    for m in row["conversations"]:
        text = m["value"]
        if "<image>" not in text:
            out.append({"role": roles[m["from"]], "content": text})
            continue
        parts, pieces_ = [], text.split("<image>")
        for k, p in enumerate(pieces_):
            if p:
                parts.append({"type": "text", "text": p})
            if k < len(pieces_) - 1:
                parts.append({"type": "image", "image": images.pop(0)})
        out.append({"role": roles[m["from"]], "content": parts})
    return out


def absolute(messages, base):
    """The conversation transformers loads: the same parts, every image path absolute."""
    out = []
    for m in messages:
        c = m["content"]
        if isinstance(c, list):
            c = [dict(p) for p in c]
            for p in c:
                for key in ("image", "url"):
                    if key in p and p.get("type") == "image":
                        p[key] = os.path.normpath(os.path.join(base, p[key].removeprefix("file://")))
                if p.get("type") == "image_url":
                    p["image_url"] = {"url": os.path.normpath(os.path.join(base, p["image_url"]["url"]))}
        out.append({"role": m["role"], "content": c})
    return out


def make_model(fam):
    model = os.path.join(fam["out"], "model")
    if os.path.isdir(model):
        shutil.rmtree(model)
    os.makedirs(model)
    tok = Tokenizer.from_file(os.path.join(DATA, "tokenizer", "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")])
    tok.save(os.path.join(model, "tokenizer.json"))
    shutil.copy(os.path.join(DATA, "tokenizer", "tokenizer_config.json"), model)
    shutil.copy(os.path.join(TEMPLATES, fam["template"]), os.path.join(model, "chat_template.jinja"))
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump({"model_type": fam["model_type"], "architectures": [fam["arch"]]}, f, indent=1)
    with open(os.path.join(model, "preprocessor_config.json"), "w") as f:
        json.dump(dict({"image_processor_type": "Qwen2VLImageProcessor"}, **fam["image"], temporal_patch_size=2, merge_size=2),
                  f, indent=1)
    return model


def main():
    assert transformers.__version__ == "5.23.0" and tokenizers.__version__.startswith("0.23"), "pinned peers expected"
    family = sys.argv[1] if len(sys.argv) > 1 else "qwen2_5_vl"
    fam = FAMILIES[family]
    model = make_model(fam)
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model, "tokenizer.json"), eos_token="<|endoftext|>",
                                     pad_token="<|endoftext|>")
    raw_tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    with open(os.path.join(TEMPLATES, fam["template"])) as f:
        template = f.read()
    proc = fam["processor"](image_processor=Qwen2VLImageProcessor(**fam["image"]), tokenizer=hf_tok,
                            video_processor=fam["video"](), chat_template=template)
    image_ids = {raw_tok.token_to_id(t) for t in ("<|vision_start|>", "<|vision_end|>", PAD)}
    rng = random.Random(40)
    openai = [conversation(rng, i) for i in range(48)]
    share = [sharegpt(rng) for _ in range(16)]
    goldens = []
    for name, rows, to_messages in (("openai.jsonl", openai, lambda r: r["messages"]), ("sharegpt.jsonl", share, sharegpt_to_messages)):
        for row in rows:
            messages = to_messages(row)
            conv = absolute(messages, OUT)
            text = proc.apply_chat_template(conv, tokenize=False)
            out = proc.apply_chat_template(conv, tokenize=True, return_dict=True)
            ids = list(out["input_ids"][0]) if not isinstance(out["input_ids"][0], int) else list(out["input_ids"])
            grid = out["image_grid_thw"].tolist() if "image_grid_thw" in out else []
            spans = assistant_spans(text.encode(), messages, [m.encode() for m in MARKERS])
            counts = [t * h * w // 4 for t, h, w in grid]
            labels = expanded_labels(raw_tok, text.encode(), PAD.encode(), [PAD.encode() * c for c in counts], spans, ids,
                                     image_ids)
            goldens.append({"file": name, "input_ids": ids, "labels": labels, "grid": grid})
        lines = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
        if fam["out"] == OUT:
            with open(os.path.join(OUT, name), "w") as f:
                f.write(lines)
        else:  # the other families' goldens are of chat/'s conversations
            with open(os.path.join(OUT, name)) as f:
                assert f.read() == lines, f"chat/{name} is not this script's: run it for qwen2_5_vl first"
    with open(os.path.join(fam["out"], "goldens.jsonl"), "w") as f:
        for g in goldens:
            f.write(json.dumps(g) + "\n")
    n_img = sum(len(g["grid"]) for g in goldens)
    print("wrote", fam["out"], len(goldens), "conversations,", n_img, "images,", sum(1 for g in goldens if not g["grid"]), "text-only")


if __name__ == "__main__":
    main()
