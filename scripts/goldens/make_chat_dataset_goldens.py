#!/usr/bin/env python3
"""Parity goldens for the chat_template dataset type (core/src/data/chat_template.cpp) and the tokenizer's offsets.

tests/data/chat_templates/dataset_goldens/<template>.jsonl: for each (template, committed tokenizer) pair below, one
line per conversation of tests/data/chat_templates/goldens/<template>.jsonl that the template renders:
  {"messages": [...], "tools": ..., "kwargs": {...}, "input_ids": [...], "labels": [...]}   or   "error": true
  - chatml-generation (a template with {% generation %}): input_ids and labels are transformers' own
    apply_chat_template(..., tokenize=True, return_dict=True, return_assistant_tokens_mask=True): labels = the id where
    assistant_masks is 1, else -100.
  - the others: the text is transformers' apply_chat_template(tokenize=False); input_ids and offsets are HF tokenizers'
    encode(text, add_special_tokens=False); labels follow the span rule of docs/datasets.md ("chat_template"),
    reimplemented below (assistant_spans); "error": true where the rule cannot find an assistant message's content.
  Conversations are given with keys sorted (the C++ side reads rows into sorted JSON objects), never with a
  generation prompt (training data).

tests/data/tokenizers/offsets.json: HF tokenizers' offsets (converted to UTF-8 byte offsets) of sample texts for every
committed tokenizer, for encode_with_offsets.

Run with the project venv:  /root/.cache/axengine/venv/bin/python scripts/goldens/make_chat_dataset_goldens.py
Versions used: transformers 5.23, tokenizers 0.23.
"""
import json
import os

import tokenizers
import transformers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data")
PAIRS = [("chatml-generation", "qwen2_bytelevel"), ("Qwen-Qwen3-0.6B", "qwen2_bytelevel"),
         ("Qwen-Qwen2.5-7B-Instruct", "qwen2_bytelevel"), ("meta-llama-Llama-3.1-8B-Instruct", "llama3_bytelevel"),
         ("meta-llama-Llama-3.2-3B-Instruct", "llama3_bytelevel"), ("google-gemma-3-it", "qwen2_bytelevel"),
         ("mistralai-Mistral-Nemo-Instruct-2407", "transformers_llama")]
MARKERS = ["<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "</s>", "<|end|>", "<|return|>", "<|endoftext|>"]
WS = b" \t\n\r\f\v"
DATE_STRING = "24 Nov 2026"  # the day the goldens were first made; any fixed date does


def assistant_spans(text, messages, markers):
    """The span rule (data/chat_template.hpp find_assistant_spans), on UTF-8 bytes; None when it refuses."""
    spans, cursor = [], 0
    for m in messages:
        content = m.get("content")
        if not isinstance(content, str):
            continue
        needle = content.encode()
        at = text.find(needle, cursor) if needle else -1
        if at < 0:
            needle = needle.strip(WS)
            at = text.find(needle, cursor) if needle else -1
        assistant = m.get("role") == "assistant"
        if at < 0:
            if assistant and needle:
                return None
            continue
        cursor = at + len(needle)
        if not assistant:
            continue
        best = max([len(k) for k in markers if text.startswith(k, cursor)], default=0)
        spans.append((at, cursor + best))
        cursor += best
    return spans


def byte_offsets(text, char_offsets):
    pos = [0]
    for ch in text:
        pos.append(pos[-1] + len(ch.encode()))
    return [[pos[b], pos[e]] for b, e in char_offsets]


def labels_for(ids, offsets, spans):
    return [i if any(b < se and e > sb for sb, se in spans if sb < se) else -100 for i, (b, e) in zip(ids, offsets)]


def special_tokens(tok_dir):
    with open(os.path.join(tok_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    out = {}
    for k in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        v = config.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            out[k] = v
    return out


def dataset_goldens():
    out_dir = os.path.join(ROOT, "chat_templates", "dataset_goldens")
    os.makedirs(out_dir, exist_ok=True)
    total = refused = 0
    for template_name, tok_name in PAIRS:
        tok_dir = os.path.join(ROOT, "tokenizers", tok_name)
        tok = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(tok_dir, "tokenizer.json"),
                                                   **special_tokens(tok_dir))
        raw = tokenizers.Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
        with open(os.path.join(ROOT, "chat_templates", template_name + ".jinja"), encoding="utf-8") as f:
            tok.chat_template = f.read()
        markers = MARKERS + ([tok.eos_token] if tok.eos_token else [])
        rows = []
        with open(os.path.join(ROOT, "chat_templates", "goldens", template_name + ".jsonl"), encoding="utf-8") as f:
            for line in f:
                case = json.loads(line)
                if "error" in case:
                    continue
                messages = json.loads(json.dumps(case["messages"], sort_keys=True))
                tools = json.loads(json.dumps(case["tools"], sort_keys=True)) if case["tools"] else None
                kwargs = case["kwargs"]
                if "strftime_now" in tok.chat_template and "date_string" not in kwargs:
                    # Llama 3.x print today's date (strftime_now) unless date_string is given: pinned, so the
                    # goldens hold on any day (the C++ test passes the same kwargs as template_kwargs).
                    kwargs = dict(kwargs, date_string=DATE_STRING)
                row = {"messages": messages, "tools": tools, "kwargs": kwargs}
                try:
                    if template_name == "chatml-generation":
                        enc = tok.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                                      return_assistant_tokens_mask=True, **kwargs)
                        ids = list(enc["input_ids"])
                        row["input_ids"] = ids
                        row["labels"] = [i if m else -100 for i, m in zip(ids, enc["assistant_masks"])]
                    else:
                        text = tok.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)
                        enc = raw.encode(text, add_special_tokens=False)
                        offsets = byte_offsets(text, enc.offsets)
                        spans = assistant_spans(text.encode(), messages, [m.encode() for m in markers])
                        if spans is None:
                            row["error"] = True
                            refused += 1
                        else:
                            row["input_ids"] = enc.ids
                            row["labels"] = labels_for(enc.ids, offsets, spans)
                except Exception:  # the template refuses it without a generation prompt: not training data
                    continue
                rows.append(row)
        with open(os.path.join(out_dir, template_name + ".jsonl"), "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        total += len(rows)
    print(f"{total} conversations ({refused} refused by the span rule)")


OFFSET_TEXTS = [
    "Hello world", " leading space and  double  spaces ", "line one\nline two\n\n", "Ünïcödé こんにちは 🙂 emoji",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>",
    "<s>[INST] question [/INST] answer</s>", "numbers 12345 and 3.14159, tabs\there", "",
]


def offsets_golden():
    out = {}
    tok_root = os.path.join(ROOT, "tokenizers")
    for name in sorted(os.listdir(tok_root)):
        path = os.path.join(tok_root, name, "tokenizer.json")
        if not os.path.isfile(path):
            continue
        tok = tokenizers.Tokenizer.from_file(path)
        out[name] = [{"text": t, "ids": (e := tok.encode(t, add_special_tokens=False)).ids,
                      "offsets": byte_offsets(t, e.offsets)} for t in OFFSET_TEXTS]
    with open(os.path.join(tok_root, "offsets.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    dataset_goldens()
    offsets_golden()
    print(f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")
