#!/usr/bin/env python3
"""Writes the HF datasets fixtures of tests/unit/data_arrow_test.cpp into tests/data/datasets/arrow/.

Directories as users have them, written by `datasets` itself (pinned in scripts/requirements-goldens.txt):
  saved/       Dataset.save_to_disk, in 3 shards (data-0000i-of-00003.arrow + state.json + dataset_info.json):
               alpaca rows with an id, a list column and a Json feature (arrow.json text, decoded as datasets does)
  dict/        DatasetDict.save_to_disk: train (2 shards) and test, completion rows
  formatted/   a Dataset saved after set_format(columns=[...]): load_from_disk's rows have those columns only
  cache/       what load_dataset("json", ...) prepared in its cache (dataset_info.json + json-<split>.arrow)
  rows.jsonl, rows.parquet   the dict's train rows as data files (a split of a file source is "train")
and expected.json:
  "rows":   per case (source, split) the rows datasets returns: load_from_disk + ReadInstruction for saved
            directories (load_from_disk takes no split), load_dataset(..., split=...) for files and the cache
  "ranges": per (split, rows) the [from, to) of ReadInstruction.to_absolute: the rounding rule (round() halves
            to even, pct1_dropremainder), negative and clamped bounds
  "errors": split strings datasets refuses (ReadInstruction.from_spec or to_absolute raises)

  python -m venv /tmp/goldens && /tmp/goldens/bin/pip install -r scripts/requirements-goldens.txt pyarrow==26.0.1
  /tmp/goldens/bin/python scripts/goldens/make_arrow_fixtures.py
"""
import json
import pathlib
import shutil
import tempfile

import datasets
from datasets import ReadInstruction

root = pathlib.Path(__file__).resolve().parents[2]
out = root / "tests" / "data" / "datasets" / "arrow"
if out.exists():
    shutil.rmtree(out)
out.mkdir(parents=True)
datasets.disable_progress_bars()
datasets.disable_caching()

ALPACA = [
    {"id": i, "instruction": f"Add {i} and {2 * i}.", "input": "" if i % 4 == 0 else f"{i}, {2 * i}",
     "output": str(3 * i), "tags": ["math"] * (i % 3), "meta": {"level": i % 2, "src": "gen"} if i % 5 else [i]}
    for i in range(23)
]
COMPLETION_TRAIN = [{"prompt": f"{i}+{i}=", "text": str(2 * i)} for i in range(10)]
COMPLETION_TEST = [{"prompt": f"{i}+1=", "text": str(i + 1)} for i in range(4)]

features = datasets.Features({
    "id": datasets.Value("int64"), "instruction": datasets.Value("string"), "input": datasets.Value("string"),
    "output": datasets.Value("string"), "tags": datasets.List(datasets.Value("string")), "meta": datasets.Json()})
saved = datasets.Dataset.from_list(ALPACA, features=features)
saved.save_to_disk(str(out / "saved"), num_shards=3)
dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(COMPLETION_TRAIN),
                           "test": datasets.Dataset.from_list(COMPLETION_TEST)})
dd.save_to_disk(str(out / "dict"), num_shards={"train": 2, "test": 1})
formatted = datasets.Dataset.from_list(COMPLETION_TRAIN[:5]).map(lambda r: {"extra": r["text"] + "!"})
formatted.set_format(columns=["prompt", "text"])
formatted.save_to_disk(str(out / "formatted"))

with open(out / "rows.jsonl", "w") as f:
    for r in COMPLETION_TRAIN:
        f.write(json.dumps(r) + "\n")
datasets.Dataset.from_list(COMPLETION_TRAIN).to_parquet(str(out / "rows.parquet"))

tmp = pathlib.Path(tempfile.mkdtemp())
try:
    (tmp / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in COMPLETION_TRAIN))
    (tmp / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in COMPLETION_TEST))
    files = {"train": str(tmp / "train.jsonl"), "validation": str(tmp / "validation.jsonl")}
    datasets.load_dataset("json", data_files=files, cache_dir=str(tmp / "cache"))
    infos = list((tmp / "cache").glob("json/*/*/*/dataset_info.json"))
    assert len(infos) == 1, infos
    (out / "cache").mkdir()
    for p in sorted(infos[0].parent.iterdir()):
        if p.suffix in (".json", ".arrow"):
            shutil.copy(p, out / "cache" / p.name)

    def by_spec(ds, split_name, spec):
        """Rows of a saved Dataset for `spec` (its one split is named split_name), as ReadInstruction reads them."""
        rows = []
        for a in ReadInstruction.from_spec(spec).to_absolute({split_name: len(ds)}):
            rows += [ds[i] for i in range(a.from_, a.to)]
        return rows

    rows = {}
    loaded = datasets.load_from_disk(str(out / "saved"))
    for spec in ["train", "train[:20%]", "train[5:9]", "train[-3:]", "train[10%:30%]", "train[:50%]",
                 "train[-25%:-5%]", "train[20:99]", "train[:3]+train[-2:]"]:
        rows[f"saved|{spec}"] = by_spec(loaded, "train", spec)
    loaded_dd = datasets.load_from_disk(str(out / "dict"))
    for spec in ["train", "test", "train[:33%]", "test[1:3]", "train[:2]+test[-1:]", "train[-50%:]"]:
        got = []
        for a in ReadInstruction.from_spec(spec).to_absolute({k: len(v) for k, v in loaded_dd.items()}):
            got += [loaded_dd[a.splitname][i] for i in range(a.from_, a.to)]
        rows[f"dict|{spec}"] = got
    loaded_fmt = datasets.load_from_disk(str(out / "formatted"))
    rows["formatted|train"] = by_spec(loaded_fmt, "train", "train")
    for spec in ["train", "train[:25%]", "train[3:7]", "train[-4:]"]:
        rows[f"rows.jsonl|{spec}"] = datasets.load_dataset("json", data_files=str(out / "rows.jsonl"), split=spec,
                                                           cache_dir=str(tmp / "c1")).to_list()
        rows[f"rows.parquet|{spec}"] = datasets.load_dataset("parquet", data_files=str(out / "rows.parquet"), split=spec,
                                                             cache_dir=str(tmp / "c2")).to_list()
    for spec in ["train", "validation", "validation[:50%]", "train[2:4]+validation[-1:]"]:
        rows[f"cache|{spec}"] = datasets.load_dataset("json", data_files=files, split=spec, cache_dir=str(tmp / "c3")).to_list()
finally:
    shutil.rmtree(tmp)

ranges = []
for n in [0, 1, 5, 7, 10, 23, 25, 99, 100, 250, 1001]:
    for spec in ["t", "t[:]", "t[:50%]", "t[50%:]", "t[:10%]", "t[10%:30%]", "t[-10%:]", "t[:-10%]", "t[33%:67%]",
                 "t[:12%]", "t[:30%]", "t[:70%]", "t[-50%:-25%]", "t[3:8]", "t[-3:]", "t[:-3]", "t[5:2]", "t[7:1000]",
                 "t[-1000:2]", "t[:100%]", "t[-100%:]", "t[1_0:2_0]", "t[:50%](closest)", "t[:50%](pct1_dropremainder)",
                 "t[10%:-10%](pct1_dropremainder)", "t[:2]+t[-2:]", "t[:25%]+t[75%:]"]:
        try:
            got = [[a.from_, a.to] for a in ReadInstruction.from_spec(spec).to_absolute({"t": n})]
        except ValueError as e:
            got = str(e)
        ranges.append({"split": spec, "rows": n, "ranges": got})

errors = []
for spec in ["", "train[", "train[:", "train[1]", "train[::2]", "train[a:]", "train[:101%]", "train[-101%:]",
             "train[:10](closest)", "train[:10%](nearest)", "train[:10%]+test[:10%](pct1_dropremainder)", "tr ain",
             "train +", "train[1__0:]", "train[_1:]", "train[1_:]", "train.[:]", "train-x", "train[-:]", " train"]:
    try:
        ReadInstruction.from_spec(spec).to_absolute({"train": 100, "test": 100})
    except (ValueError, AssertionError) as e:
        errors.append({"split": spec, "datasets": str(e)})
    else:
        raise SystemExit(f"datasets accepts {spec!r}: not an error case")

(out / "expected.json").write_text(json.dumps({"datasets": datasets.__version__, "rows": rows, "ranges": ranges,
                                               "errors": errors}, indent=1, ensure_ascii=False) + "\n")
print(f"wrote {out} with datasets {datasets.__version__}")
