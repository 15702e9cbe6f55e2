#!/usr/bin/env python3
"""Writes the dataset-file fixtures of tests/unit/data_files_test.cpp into tests/data/datasets/.

Real files as users have them, written by the libraries that write them: Parquet by pyarrow (the library under
HF `datasets`' on-disk format, sharded the way `datasets` names its files: data/train-00000-of-00002.parquet),
a JSON array as json.dump writes one, JSON Lines as `Dataset.to_json` writes it (".json" extension). Beside
them, expected.json: every file's rows as JSON objects, which our reader must return exactly, and the token
ids of the alpaca rows under the test tokenizer (tests/data/tokenizers/qwen2_bytelevel) as the `tokenizers`
package encodes the Stanford Alpaca prompt and the output.

  $AXENGINE_VENV/bin/python scripts/goldens/make_data_fixtures.py    # pyarrow: scripts/requirements.txt
"""
import json
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer

root = pathlib.Path(__file__).resolve().parents[2]
out = root / "tests" / "data" / "datasets"
out.mkdir(parents=True, exist_ok=True)

ALPACA = [
    {"instruction": "Add the numbers.", "input": "12, 35", "output": "47"},
    {"instruction": "Name a primary colour.", "input": "", "output": "Red."},
    {"instruction": "Übersetze ins Englische: „Guten Morgen“", "input": None, "output": "Good morning 🌅"},
    {"instruction": "Fill the {input} braces.", "input": "{instruction} {output}", "output": "{}"},
]
PRETOK = [
    {"input_ids": [1, 5, 9], "labels": [-100, 5, 9], "attention_mask": [1, 1, 1]},
    {"input_ids": [3, 4, 0, 0], "labels": [3, 4, -100, -100], "attention_mask": [1, 1, 0, 0]},
    {"input_ids": [7, 8], "labels": None, "attention_mask": None},
]
# What a chat dataset's Parquet holds: list<struct<role, content>> (read as the JSON rows would be).
CHAT = [
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}], "id": 0},
    {"messages": [{"role": "system", "content": ""}, {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4"}], "id": 1},
]

expected = {}

# Parquet: alpaca rows in two row groups, one column dictionary-encoded; pretokenized ids as list<int64>;
# a chat column of structs; and one split sharded in two files as `datasets` names them.
pq.write_table(pa.Table.from_pylist(ALPACA), out / "alpaca.parquet", row_group_size=2, use_dictionary=["input"])
expected["alpaca.parquet"] = ALPACA
pretok_schema = pa.schema([("input_ids", pa.list_(pa.int64())), ("labels", pa.list_(pa.int64())),
                           ("attention_mask", pa.list_(pa.int8()))])
pq.write_table(pa.Table.from_pylist(PRETOK, schema=pretok_schema), out / "pretok.parquet")
expected["pretok.parquet"] = PRETOK
pq.write_table(pa.Table.from_pylist(CHAT), out / "chat.parquet")
expected["chat.parquet"] = CHAT
(out / "sharded").mkdir(exist_ok=True)
for i, rows in enumerate([ALPACA[:3], ALPACA[3:]]):
    name = f"sharded/train-{i:05d}-of-00002.parquet"
    pq.write_table(pa.Table.from_pylist(rows), out / name)
    expected[name] = rows
# A column of a type no dataset type reads: refused naming the column.
pq.write_table(pa.table({"text": ["a"], "blob": pa.array([b"\x00\x01"], pa.binary())}), out / "binary.parquet")

# JSON: an array (indented, as json.dump(..., indent=2) writes it) and JSON Lines in a ".json" file.
(out / "alpaca_array.json").write_text(json.dumps(ALPACA, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
expected["alpaca_array.json"] = ALPACA
(out / "alpaca_lines.json").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ALPACA), encoding="utf-8")
expected["alpaca_lines.json"] = ALPACA

# The alpaca samples: axolotl's `alpaca` prompt style (with and without input), prompt and output tokenised
# separately (no special tokens), [EOS] appended; the prompt's tokens get no loss.
WITH_INPUT = ("Below is an instruction that describes a task, paired with an input that provides further context. "
              "Write a response that appropriately completes the request.\n\n"
              "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
NO_INPUT = ("Below is an instruction that describes a task. "
            "Write a response that appropriately completes the request.\n\n"
            "### Instruction:\n{instruction}\n\n### Response:\n")
tok = Tokenizer.from_file(str(root / "tests/data/tokenizers/qwen2_bytelevel/tokenizer.json"))
cfg = json.loads((root / "tests/data/tokenizers/qwen2_bytelevel/tokenizer_config.json").read_text())
eos = tok.token_to_id(cfg["eos_token"]) if isinstance(cfg.get("eos_token"), str) else None
samples = []
for r in ALPACA:
    # str.format, as axolotl fills them: braces in the values are text, never placeholders.
    if r["input"]:
        prompt = WITH_INPUT.format(instruction=r["instruction"], input=r["input"])
    else:
        prompt = NO_INPUT.format(instruction=r["instruction"])
    p = tok.encode(prompt, add_special_tokens=False).ids
    o = tok.encode(r["output"], add_special_tokens=False).ids + ([eos] if eos is not None else [])
    samples.append({"prompt": prompt, "input_ids": p + o, "labels": [-100] * len(p) + o})
expected["alpaca_samples"] = samples

(out / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
print(f"wrote {out} (pyarrow {pa.__version__})")
