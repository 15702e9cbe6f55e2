#!/usr/bin/env python3
"""Parity goldens for axengine's Jinja chat-template renderer (core/src/jinja), made by HF transformers.

For every template in tests/data/chat_templates/*.jinja, tests/data/chat_templates/goldens/<template>.jsonl gets one
line per conversation:
  {"messages": [...], "tools": [...] | null, "add_generation_prompt": bool, "kwargs": {...},
   "expected": "<rendered text>"}            or  "error": "<raise_exception message>" where the template refuses it
  and, for templates with {% generation %}, "generation": [[start, end], ...] (character offsets, Python str
  indices = Unicode code points) of what the assistant wrote: the spans return_assistant_tokens_mask masks.

Rendering is transformers' own: transformers.utils.chat_template_utils.render_jinja_template, the function
PreTrainedTokenizerBase.apply_chat_template(tokenize=False) calls, given the special tokens apply_chat_template
passes (bos_token, eos_token). `strftime_now` is pinned to 2025-03-14 so the dated templates (Llama 3.x, gpt-oss)
render the same on any day; the C++ side pins the same date.

Run with the project venv:  /root/.cache/axengine/venv/bin/python scripts/goldens/make_chat_template_goldens.py
Versions used: transformers 5.23, jinja2 3.1.6 (scripts/requirements.txt pins transformers).
"""
import datetime as _dt
import json
import os
import random
import re

import transformers
from transformers.utils import chat_template_utils as ctu

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "chat_templates")
FIXED_NOW = _dt.datetime(2025, 3, 14, 15, 9, 26)
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}
PER_TEMPLATE = 40  # 8 templates x 40 = 320 conversations


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


ctu.datetime = _FixedDatetime  # strftime_now reads the module's `datetime`

TEXTS = [
    "Hello!", "What is 2+2?", "", "   padded with spaces   ", "line one\nline two\n\nline four",
    "Ünïcödé: こんにちは世界 — 🙂 emoji, Ελληνικά, עברית", "quotes \"double\" and 'single' and \\backslash",
    "tabs\there\tand trailing newline\n", "{{ not a template }} {% neither %}", "<think>\nhidden\n</think>\n\nvisible",
    "Short.", "A longer answer with several sentences. It goes on. And on, with numbers 1, 2.5, -3e8.",
    "\n\nleading newlines", "json-ish: {\"a\": [1, 2, {\"b\": null}]}", "<tool_response>\nok\n</tool_response>",
]
SYSTEMS = ["You are a helpful assistant.", "", "Système: réponds en français. 🇫🇷", "Be brief.\nVery brief."]
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            "days": {"type": "integer"}, "flags": {"type": "array", "items": {"type": "string"}},
            "opts": {"type": "object", "properties": {"x": {"type": "number"}}},
            "either": {"oneOf": [{"type": "string"}, {"type": "number", "description": "a number"}]},
            "maybe": {"type": ["string", "null"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web 🔎",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "top": {"type": "number", "default": 3.5}},
                       "required": ["query"]}}},
    {"type": "function", "function": {"name": "noargs", "description": "Takes nothing", "parameters": {}}},
]


def tool_call(rng, i):
    args = rng.choice([{"city": "Paris", "unit": "celsius"}, {"query": "naïve café", "top": 2}, {},
                       {"nested": {"list": [1, 2.5, True, None], "s": "ü"}}])
    name = rng.choice(["get_weather", "search", "noargs"])
    call = {"type": "function", "function": {"name": name, "arguments": args}}
    call["id"] = rng.choice(["abc123XYZ", "call0000%d" % i, "id_" + str(i)])[:9].ljust(9, "0")
    return call


def conversation(rng, kind):
    """kind: "plain" (user/assistant alternating), "tools" (tool calls and results)."""
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": rng.choice(SYSTEMS)})
    turns = rng.randint(1, 4)
    for t in range(turns):
        msgs.append({"role": "user", "content": rng.choice(TEXTS)})
        if kind == "tools" and rng.random() < 0.6:
            n = 1 if rng.random() < 0.7 else 2
            calls = [tool_call(rng, t * 2 + k) for k in range(n)]
            msgs.append({"role": "assistant", "content": rng.choice(["", "Let me check."]), "tool_calls": calls})
            for c in calls:
                msgs.append({"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
                             "content": rng.choice(["{\"temp\": 21}", "sunny, 21°C", "[]", ""])})
        last = t == turns - 1
        if not last or rng.random() < 0.75:
            m = {"role": "assistant", "content": rng.choice(TEXTS)}
            if rng.random() < 0.2:
                m["reasoning_content"] = rng.choice(["Think step by step.", "Ü reasoning\nover lines"])
            msgs.append(m)
    return msgs


def render(template, case):
    kwargs = dict(SPECIAL, **case["kwargs"])
    gen = re.search(r"\{%-?\s*generation\s*-?%\}", template) is not None
    try:
        out, indices = ctu.render_jinja_template(
            conversations=[case["messages"]], tools=case["tools"], chat_template=template,
            add_generation_prompt=case["add_generation_prompt"], return_assistant_tokens_mask=gen, **kwargs)
    except Exception as e:  # jinja2.TemplateError from raise_exception, or a template's own runtime error
        return {"error": str(e), "error_type": type(e).__name__}
    res = {"expected": out[0]}
    if gen:
        res["generation"] = [list(p) for p in indices[0]]
    return res


def cases_for(name, rng):
    out = []
    for i in range(PER_TEMPLATE):
        kind = "tools" if i % 2 else "plain"
        case = {"messages": conversation(rng, kind),
                "tools": rng.choice([TOOLS, TOOLS[:1]]) if kind == "tools" and rng.random() < 0.8 else None,
                "add_generation_prompt": rng.random() < 0.4, "kwargs": {}}
        if "Qwen3" in name and rng.random() < 0.3:
            case["kwargs"]["enable_thinking"] = rng.random() < 0.5
        if "gpt-oss" in name and rng.random() < 0.4:
            case["kwargs"]["reasoning_effort"] = rng.choice(["low", "high"])
            case["kwargs"]["builtin_tools"] = rng.choice([["browser"], ["python"], ["browser", "python"]])
        if "Llama" in name and rng.random() < 0.3:
            case["kwargs"]["tools_in_user_message"] = False
        out.append(case)
    # A few fixed edge cases for every template.
    out.append({"messages": [{"role": "user", "content": ""}], "tools": None, "add_generation_prompt": True, "kwargs": {}})
    out.append({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}], "tools": None,
                "add_generation_prompt": False, "kwargs": {}})
    out.append({"messages": [{"role": "assistant", "content": "starts with assistant"}], "tools": None,
                "add_generation_prompt": False, "kwargs": {}})
    return out


def main():
    gdir = os.path.join(ROOT, "goldens")
    os.makedirs(gdir, exist_ok=True)
    total = errors = 0
    for fname in sorted(os.listdir(ROOT)):
        if not fname.endswith(".jinja"):
            continue
        name = fname[:-len(".jinja")]
        with open(os.path.join(ROOT, fname), encoding="utf-8") as f:
            template = f.read()
        rng = random.Random(name)
        with open(os.path.join(gdir, name + ".jsonl"), "w", encoding="utf-8") as f:
            for case in cases_for(name, rng):
                # transformers aliases reasoning fields itself; the golden input stays what the user gave.
                row = dict(case, **render(template, case))
                errors += "error" in row
                total += 1
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{total} conversations ({errors} refused by their template), transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
