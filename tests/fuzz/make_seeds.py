#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/<harness>/) from the test data in tests/data,
the configs in configs/ and small hand-written inputs. Deterministic; rerun after changing it and commit the
result. Multi-part inputs use the harness separator (harness.hpp: kSeparator)."""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")
DATA = os.path.join(ROOT, "tests", "data")
SEP = b"\n#-#-#\n"


def put(harness, name, data):
    d = os.path.join(OUT, harness)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, raw bytes)] -> file bytes, laid out as HF writes them."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def f32(*xs):
    return struct.pack("<%df" % len(xs), *xs)


# --- safetensors_file
put("safetensors_file", "two_f32", safetensors([("a", "F32", [2, 2], f32(1, 2, 3, 4)), ("b", "F32", [1], f32(5))]))
put("safetensors_file", "dtypes", safetensors([
    ("bf16", "BF16", [2], b"\x80\x3f\x00\x40"), ("f16", "F16", [1], b"\x00\x3c"), ("f64", "F64", [1], b"\0" * 8),
    ("i64", "I64", [1], b"\1" + b"\0" * 7), ("i32", "I32", [], b"\2\0\0\0"), ("i16", "I16", [1], b"\3\0"),
    ("i8", "I8", [2], b"\4\5"), ("u8", "U8", [1], b"\6"), ("bool", "BOOL", [1], b"\1"),
    ("e4m3", "F8_E4M3", [2], b"\x38\x40"), ("e5m2", "F8_E5M2", [1], b"\x3c")]))
put("safetensors_file", "empty_tensor_and_metadata",
    safetensors([("z", "F32", [0, 3], b""), ("w", "F32", [1, 1], f32(0.5))], {"format": "pt", "note": "x"}))
put("safetensors_file", "header_only", safetensors([]))
for src in ["models/qwen3_moe_top1/adapter/adapter_model.safetensors", "models/qwen3/adapter/adapter_model.safetensors"]:
    put("safetensors_file", src.replace("/", "_"), read(os.path.join(DATA, src)))

# --- safetensors_index: index, then "<shard name>\n<bytes>" parts
shard1 = safetensors([("model.embed_tokens.weight", "F32", [2, 2], f32(1, 2, 3, 4))])
shard2 = safetensors([("model.norm.weight", "F32", [2], f32(1, 1)), ("lm_head.weight", "BF16", [1, 2], b"\0\0\0\0")])
index = {"metadata": {"total_size": 28}, "weight_map": {
    "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
    "model.norm.weight": "model-00002-of-00002.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"}}
put("safetensors_index", "two_shards", json.dumps(index, indent=2).encode() + SEP +
    b"model-00001-of-00002.safetensors\n" + shard1 + SEP + b"model-00002-of-00002.safetensors\n" + shard2)
put("safetensors_index", "one_shard", json.dumps({"weight_map": {"model.embed_tokens.weight": "a.safetensors"}}).encode()
    + SEP + b"a.safetensors\n" + shard1)
put("safetensors_index", "missing_shard", json.dumps(index).encode() + SEP + b"model-00001-of-00002.safetensors\n" + shard1)

# --- config: the shipped configs, and overrides
for name in sorted(os.listdir(os.path.join(ROOT, "configs"))):
    put("config", name, read(os.path.join(ROOT, "configs", name)))
put("config", "overrides", read(os.path.join(ROOT, "configs", "quickstart.toml")) + SEP + b"train.lr=1e-4" + SEP +
    b"run.seed=7" + SEP + b"kernels.moe=[\"reference\"]" + SEP + b"datasets=1")
put("config", "all_sections", """[run]
output_dir = "out"
seed = -3
log_level = "warn"
[model]
path = "m"
dtype = "bf16"
weight_format = "nf4"
[device]
type = "cpu"
arch = "sm_90"
[plugins]
paths = ["p", "/abs/q.so"]
[kernels]
strict = true
moe = ["reference"]
[kernels.arch.sm_120]
moe = ["scattermoe", "reference"]
[data]
sequence_len = 64
eval_fraction = 0.1
cache = false
[[datasets]]
type = "pretokenized"
path = "a.jsonl"
on_bad_row = "skip"
eval_fraction = 0.2
[lora]
r = 8
alpha = 16.0
dropout = 0.05
targets = ["q_proj"]
[train]
lr = 1e-3
schedule = "linear"
min_lr_ratio = 0.1
weight_decay = 0.01
optimizer = "adamw"
[optimizer]
beta1 = 0.9
[checkpoint]
every_steps = 10
resume_from = "latest"
[eval]
every_steps = 5
exact_match = false
[profile]
steps = 2
""")

# --- datasets: a flag byte (bit 0 skip bad rows, bit 1 prompt field, bit 2 no BOS), then JSONL
rows = [{"prompt": "7+5=", "text": "12"}, {"prompt": "Translate: chat", "text": " cat\n"},
        {"text": "Hello world, 你好 🌍 \u00e9\u0301"}, {"prompt": "", "text": "<|endoftext|> special inside"}]
jsonl = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
put("dataset_completion", "prompted", b"\x02" + jsonl)
put("dataset_completion", "text_only", b"\x00" + jsonl)
put("dataset_completion", "skip_bad", b"\x03" + jsonl + b"not json\n{\"text\": 5}\n\r\n   \n[1]\n{\"prompt\": \"p\"}\r\n")
put("dataset_pretokenized", "rows", b"\x00" + b'{"input_ids": [1, 5, 9]}\n{"input_ids": [3, 4], "labels": [-100, 4]}\n'
    b'{"input_ids": [7, 8, 9], "labels": [7, 8, -100], "attention_mask": [1, 1, 0]}\n')
put("dataset_pretokenized", "skip_bad", b"\x01" + b'{"input_ids": [1, 2], "attention_mask": [0, 0]}\n'
    b'{"input_ids": [999999999]}\n{"input_ids": []}\n{"input_ids": [1.5]}\n{"input_ids": [2], "labels": [2, 3]}\n'
    b'{"input_ids": [151643, 0]}\n')

# --- chat_template rows: a flag byte (dataset_chat.cpp: bit 0 skip, bit 1 ShareGPT, bits 2-3 train_on, bit 4 the
# generation template, bit 5 tools), then JSONL
def chat_seed(path):
    return read(os.path.join(DATA, "datasets", "chat", path))
put("dataset_chat", "messages", b"\x00" + chat_seed("messages.jsonl"))
put("dataset_chat", "messages_generation_last", b"\x18" + chat_seed("messages.jsonl"))
put("dataset_chat", "sharegpt_all", b"\x06" + chat_seed("sharegpt.jsonl"))
tool_rows = [{"messages": [{"role": "user", "content": "weather?"},
                           {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": {"city": "Paris"}}}]},
                           {"role": "tool", "content": "sunny", "tool_call_id": "1"}, {"role": "assistant", "content": "Sunny."}],
              "tools": [{"type": "function", "function": {"name": "w", "parameters": {}}}]},
             {"messages": [{"role": "robot", "content": "x"}]}, {"messages": []}, {"messages": [{"role": "user", "content": 5}]}]
put("dataset_chat", "tools_skip_bad", b"\x21" + "".join(json.dumps(r) + "\n" for r in tool_rows).encode())

# --- chat_template rows with images (dataset_chat_images.cpp: bit 0 skip, bit 1 ShareGPT, bits 2-3 train_on), then
# JSONL; image paths resolve against plugins/mm_cpt/tests/data/images
def chat_image_seed(name, rows=None):
    path = os.path.join(ROOT, "plugins", "mm_cpt", "tests", "data", "chat", name)
    lines = read(path).decode().splitlines(keepends=True)
    return "".join(lines[:rows] if rows else lines).replace("../images/", "").encode()
put("dataset_chat_images", "openai", b"\x00" + chat_image_seed("openai.jsonl", 12))
put("dataset_chat_images", "sharegpt_all", b"\x06" + chat_image_seed("sharegpt.jsonl", 8))
bad_image_rows = [
    {"messages": [{"role": "user", "content": [{"type": "image", "image": "gone.png"}]}, {"role": "assistant", "content": "x"}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]},
                  {"role": "assistant", "content": "x"}]},
    {"messages": [{"role": "user", "content": [{"type": "image", "image": "a.jpg"}, {"type": "text", "text": "hi <image>"}]},
                  {"role": "assistant", "content": [{"type": "image", "image": "b.png"}]}]},
    {"messages": [{"role": "user", "content": "<image> twice <image>"}, {"role": "assistant", "content": "x"}], "images": ["a.jpg"]},
    {"messages": [{"role": "user", "content": [{"type": "video", "video": "v.mp4"}, {"type": "image", "base64": "AA"}]}]},
    {"messages": [{"role": "user", "content": [{"type": "image", "image": "file://k_tiny.png"}, {"type": "text", "text": "ok"}]},
                  {"role": "assistant", "content": "fine"}]}]
put("dataset_chat_images", "bad_rows_skip", b"\x01" + "".join(json.dumps(r) + "\n" for r in bad_image_rows).encode())

# --- data files: a flag byte (bit 0 Parquet, bit 1 pretokenized, bit 2 skip bad rows), then the file. The
# Parquet seeds are the pyarrow-written fixtures (scripts/goldens/make_data_fixtures.py): valid footers and
# schemas (dictionaries, nulls, list<int64>, list<struct>) for the mutations to start from.
def fixture(name):
    with open(os.path.join(DATA, "datasets", name), "rb") as f:
        return f.read()
put("dataset_files", "alpaca_parquet", b"\x01" + fixture("alpaca.parquet"))
put("dataset_files", "alpaca_parquet_skip", b"\x05" + fixture("alpaca.parquet"))
put("dataset_files", "pretok_parquet", b"\x03" + fixture("pretok.parquet"))
put("dataset_files", "chat_parquet", b"\x05" + fixture("chat.parquet"))
put("dataset_files", "binary_parquet", b"\x01" + fixture("binary.parquet"))
put("dataset_files", "alpaca_json", b"\x00" + fixture("alpaca_array.json"))
put("dataset_files", "pretok_json_skip", b"\x06" + b'[{"input_ids": [1, 2], "attention_mask": [0, 0]}, {"input_ids": [5]}, 3, '
    b'{"input_ids": [2], "labels": null}, {"input_ids": [999999999]}]')

# --- tokenizers: each test tokenizer with its vocabulary trimmed (small seeds mutate faster), plus texts
texts = []
for name in sorted(os.listdir(os.path.join(DATA, "tokenizers"))):
    d = os.path.join(DATA, "tokenizers", name)
    if not os.path.exists(os.path.join(d, "tokenizer.json")):
        continue
    tok = json.loads(read(os.path.join(d, "tokenizer.json")))
    cfg = read(os.path.join(d, "tokenizer_config.json")) if os.path.exists(os.path.join(d, "tokenizer_config.json")) else b""
    exp = os.path.join(d, "expected.json")
    cases = json.loads(read(exp))["cases"] if os.path.exists(exp) else []
    texts += [c["text"] for c in cases]
    model = tok.get("model", {})
    if isinstance(model.get("vocab"), dict):
        keep = {t: i for t, i in model["vocab"].items() if i < 300}
        model["vocab"] = keep
        merges = []
        for m in model.get("merges", []):
            a, b = m.split(" ", 1) if isinstance(m, str) else m
            if a in keep and b in keep and a + b in keep:
                merges.append(m)
        model["merges"] = merges
    text = (cases[3]["text"] if len(cases) > 3 else "Hello world").encode()
    put("tokenizer_json", name, json.dumps(tok, ensure_ascii=False).encode() + SEP + cfg + SEP + text)
put("tokenizer_json", "axengine_bytelevel_full", read(os.path.join(DATA, "tokenizers/axengine_bytelevel/tokenizer.json"))
    + SEP + read(os.path.join(DATA, "tokenizers/axengine_bytelevel/tokenizer_config.json")) + SEP + b"12+35=47<|endoftext|>")
seen = set()
for i, t in enumerate(texts):
    b = t.encode()
    if b in seen or len(b) > 2000:
        continue
    seen.add(b)
    put("tokenizer_encode", "text%03d" % len(seen), bytes([len(seen) % 16]) + b)
put("tokenizer_encode", "invalid_utf8", b"\x05" + b"ab\xff\xfe\xc3(\xe2\x82 \xf0\x9f\x98 <s></s> \x00 end")

# --- hf_config: the test models' config.json, and variants of the keys parse_hf_config reads
for name in sorted(os.listdir(os.path.join(DATA, "models"))):
    put("hf_config", name, read(os.path.join(DATA, "models", name, "config.json")))
llama = json.loads(read(os.path.join(DATA, "models/llama/config.json")))
v = dict(llama, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192})
put("hf_config", "llama_rope_llama3", json.dumps(v, indent=1))
v = dict(llama, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}, sliding_window=128,
         head_dim=16, eos_token_id=[1, 2])
put("hf_config", "llama_rope_params_v5", json.dumps(v, indent=1))
v = dict(llama, rope_scaling={"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 512, "mscale": 1.0,
                              "mscale_all_dim": 0.707, "beta_fast": 16, "beta_slow": 2, "truncate": False},
         max_position_embeddings=4096)
put("hf_config", "llama_rope_yarn_v4", json.dumps(v, indent=1))
v = dict(llama, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}, max_position_embeddings=16)
put("hf_config", "llama_rope_dynamic", json.dumps(v, indent=1))
q2 = json.loads(read(os.path.join(DATA, "models/qwen2/config.json")))
v = dict(q2, max_window_layers=2)
del v["layer_types"]
put("hf_config", "qwen2_max_window_layers", json.dumps(v, indent=1))
put("hf_config", "gemma3_v4", read(os.path.join(DATA, "models/gemma3/config_v4.json")))
g3 = json.loads(read(os.path.join(DATA, "models/gemma3/config.json")))
v = dict(g3, sliding_window_pattern=2, rope_parameters={"sliding_attention": {"rope_type": "yarn", "factor": 4.0,
                                                                              "rope_theta": 100.0}})
del v["layer_types"]
put("hf_config", "gemma3_pattern_yarn_local", json.dumps(v, indent=1))
# gpt_oss with every key GptOssConfig defaults left out (head_dim, eps, layer_types, window, YaRN, biases)
go = json.loads(read(os.path.join(DATA, "models/gpt_oss/config.json")))
v = {k: x for k, x in go.items() if k not in ("head_dim", "rms_norm_eps", "layer_types", "sliding_window",
                                              "rope_parameters", "attention_bias")}
put("hf_config", "gpt_oss_defaults", json.dumps(v, indent=1))
# the pre-quantised (bitsandbytes 4-bit) checkpoints' configs: quantization_config, and variants of its keys
for name in sorted(os.listdir(os.path.join(DATA, "bnb"))):
    put("hf_config", "bnb_" + name, read(os.path.join(DATA, "bnb", name, "config.json")))
bnbcfg = json.loads(read(os.path.join(DATA, "bnb/qwen3_nf4_dq/config.json")))
v = dict(bnbcfg, quantization_config={"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "llm_int8_skip_modules": ["lm_head"]})
put("hf_config", "bnb_no_quant_method", json.dumps(v, indent=1))

# --- bnb_quant_state: the JSON each packed weight of the pre-quantised checkpoints carries, and variants
def safetensors_tensor(path, name):
    raw = read(path)
    n = struct.unpack("<Q", raw[:8])[0]
    info = json.loads(raw[8:8 + n])[name]
    a, b = info["data_offsets"]
    return raw[8 + n + a:8 + n + b]
for name in sorted(os.listdir(os.path.join(DATA, "bnb"))):
    key = "model.layers.0.mlp.down_proj.weight.quant_state.bitsandbytes__nf4"
    put("bnb_quant_state", name, safetensors_tensor(os.path.join(DATA, "bnb", name, "model.safetensors"), key))
qs = {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [64, 96], "nested_blocksize": 256,
      "nested_dtype": "float32", "nested_offset": 0.053254157304763794}
put("bnb_quant_state", "bf16_nested", json.dumps(qs))
put("bnb_quant_state", "fp4", json.dumps(dict(qs, quant_type="fp4")))
put("bnb_quant_state", "blocksize_4096_3d", json.dumps(dict(qs, blocksize=4096, shape=[4, 64, 128])))
put("bnb_quant_state", "offset_huge", json.dumps(dict(qs, nested_offset=1e300)))
put("bnb_quant_state", "shape_overflow", json.dumps(dict(qs, shape=[2**40, 2**40])))

# --- plugin_descriptor: the descriptors of the repository's plugins, as AXENGINE_PLUGIN_DESCRIPTOR wraps them
descs = []
for dirpath, _, files in sorted(os.walk(ROOT)):
    if "/build" in dirpath or "/.git" in dirpath:
        continue
    for f in sorted(files):
        if f.endswith((".cpp", ".cu")):
            src = read(os.path.join(dirpath, f)).decode(errors="replace")
            for m in re.finditer(r'AXENGINE_PLUGIN_DESCRIPTOR\(R"\((.*?)\)"\)', src, re.S):
                descs.append((f, m.group(1)))
for i, (f, plugin) in enumerate(descs):
    text = ('{"axengine_plugin": 1, "abi": "1.0", "fingerprint": {"torch": "2.11.0", "cuda": "none", '
            '"compiler": "gcc 12", "cxx11_abi": "1"}, "plugin": ' + plugin + "}")
    put("plugin_descriptor", "%02d_%s" % (i, f.rsplit(".", 1)[0]), text)

# --- plugin_elf: minimal shared objects carrying a descriptor section (and one without), linked here
with tempfile.TemporaryDirectory() as tmp:
    desc = read(os.path.join(OUT, "plugin_descriptor", sorted(os.listdir(os.path.join(OUT, "plugin_descriptor")))[0]))
    c = os.path.join(tmp, "p.c")
    lit = json.dumps(desc.decode())
    with open(c, "w") as fh:
        fh.write('__attribute__((section("axengine_plugin"), used, visibility("default"))) const char '
                 'axengine_plugin_descriptor[] = %s;\nint axengine_plugin_register(void* r) { return r != 0; }\n' % lit)
    for name, extra in [("with_descriptor", []), ("without_descriptor", ["-DNO_SECTION"])]:
        src = c
        if extra:
            src = os.path.join(tmp, "q.c")
            with open(src, "w") as fh:
                fh.write("int other(int x) { return x + 1; }\n")
        so = os.path.join(tmp, name + ".so")
        subprocess.run(["gcc", "-shared", "-fPIC", "-nostdlib", "-Os", "-s", "-Wl,--build-id=none",
                        "-Wl,-z,max-page-size=4096", "-Wl,-z,noseparate-code", "-Wl,--hash-style=gnu",
                        "-o", so, src], check=True)
        put("plugin_elf", name, read(so))
    elf = read(os.path.join(OUT, "plugin_elf", "with_descriptor"))
    put("plugin_elf", "truncated", elf[: len(elf) // 2])

# --- checkpoint: flag byte, then step digits, trainer_state.json, trainer_state.safetensors, manifest.json
state = {"step": 4, "epoch": 1, "step_in_epoch": 1, "steps_per_epoch": 3, "total_steps": 9, "seed": 42,
         "lr_next": 0.0001, "best_eval_loss": None, "config": "run.toml"}
tensors = safetensors([("param/layers.0.q_proj.lora_A", "F32", [2, 2], f32(1, 2, 3, 4)),
                       ("optim/layers.0.q_proj.lora_A.exp_avg", "F32", [2, 2], f32(0, 0, 0, 0)),
                       ("optim/step", "I64", [], struct.pack("<q", 4)), ("rng/cpu", "U8", [4], b"\1\2\3\4")],
                      {"format": "axengine-trainer-state-v1"})
sj = (json.dumps(state, indent=2) + "\n").encode()
def crc32c(b):
    crc = 0xFFFFFFFF
    for x in b:
        crc ^= x
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF
manifest = {"format": "axengine-checkpoint-manifest-v1", "files": {
    "trainer_state.json": {"size": len(sj), "crc32c": "%08x" % crc32c(sj)},
    "trainer_state.safetensors": {"size": len(tensors), "crc32c": "%08x" % crc32c(tensors)}}}
mj = json.dumps(manifest, indent=2).encode()
put("checkpoint", "valid_given_manifest", b"\x00" + b"00000004" + SEP + sj + SEP + tensors + SEP + mj)
put("checkpoint", "valid_regenerated_manifest", b"\x01" + b"00000004" + SEP + sj + SEP + tensors)
put("checkpoint", "no_manifest", b"\x00" + b"00000004" + SEP + sj + SEP + tensors)
put("checkpoint", "fallback_to_older", b"\x02" + b"00000004" + SEP + sj[:-20] + SEP + tensors + SEP + mj)
best = dict(state, best_eval_loss=1.25, step=3, epoch=1, step_in_epoch=0)
put("checkpoint", "best_eval", b"\x01" + b"3" + SEP + json.dumps(best).encode() + SEP + tensors)
counts = dict(state, tokens_seen=4096, trainable_tokens_seen=3000)  # the run's token accounting
put("checkpoint", "token_counts", b"\x01" + b"00000004" + SEP + json.dumps(counts).encode() + SEP + tensors)

# --- peft_adapter: the tiny Llama's adapter (its sites are the harness's), and variants of the config
adir = os.path.join(DATA, "models/llama/adapter")
acfg = json.loads(read(os.path.join(adir, "adapter_config.json")))
atensors = read(os.path.join(adir, "adapter_model.safetensors"))
put("peft_adapter", "llama", json.dumps(acfg, indent=2).encode() + SEP + atensors)
put("peft_adapter", "llama_patterns", json.dumps(dict(acfg, rank_pattern={"model.layers.0.self_attn.q_proj": 2},
    alpha_pattern={".*k_proj": 3.0}, use_rslora=True)).encode() + SEP + atensors)
put("peft_adapter", "config_only", json.dumps(dict(acfg, target_modules=["q_proj"])).encode())

# --- chat_template: the real chat templates (tests/data/chat_templates), alone (the harness's fixed conversation)
# and with a golden conversation as the context part; plus small templates for the less common syntax.
ctdir = os.path.join(DATA, "chat_templates")
for fname in sorted(os.listdir(ctdir)):
    if fname.endswith(".jinja"):
        name = fname[:-len(".jinja")]
        tmpl = read(os.path.join(ctdir, fname))
        put("chat_template", name, tmpl)
        with open(os.path.join(ctdir, "goldens", name + ".jsonl"), "rb") as f:
            row = json.loads(f.readline())
        ctx = dict(messages=row["messages"], tools=row["tools"], add_generation_prompt=row["add_generation_prompt"],
                   bos_token="<s>", eos_token="</s>", **row["kwargs"])
        put("chat_template", name + "_ctx", tmpl + SEP + json.dumps(ctx, ensure_ascii=False).encode())
for case in json.loads(read(os.path.join(ctdir, "jinja_cases.json"))):
    put("chat_template", "case_" + case["name"], case["template"].encode() + SEP + json.dumps(case["context"]).encode())
put("chat_template", "macro_slices", b"{% macro m(a, b=[1,2][::-1]) -%} {{ a ~ b|tojson(indent=2) }} {%- endmacro %}"
    b"{% for k, v in {'x': 1}.items() if k %}{{ m(k, b=v) }}{% else %}{% break %}{% endfor %}"
    b"{% set ns = namespace(a='\\u00e9') %}{% set ns.a = ns.a[1:] %}{{ ns.a is string }}{% generation %}g{% endgeneration %}")

# --- generate_request: a JSONL request row of `axengine generate`, then a model dir's tokenizer_config.json (its
# chat_template and special tokens), rendered for the row's messages.
_chatml = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
put("generate_request", "prompt", b'{"prompt": "The sum of 2 and 3 is", "id": 7}')
put("generate_request", "messages_chatml", json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi \u00fc"}], "id": "a"}).encode()
    + SEP + json.dumps({"chat_template": _chatml, "bos_token": "<s>", "eos_token": {"content": "</s>"}}).encode())
put("generate_request", "template_list", json.dumps({"messages": [{"role": "user", "content": None}]}).encode()
    + SEP + json.dumps({"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": _chatml}]}).encode())
put("generate_request", "bad_key", b'{"promt": "x"}' + SEP + b'{"chat_template": 3}')

# --- dataset_arrow: directories HF datasets wrote (tests/data/datasets/arrow, scripts/goldens/make_arrow_fixtures.py),
# "<layout><type><split>" then the layout's files (tests/fuzz/dataset_arrow.cpp).
ARROW = os.path.join(DATA, "datasets", "arrow")


def arrow_dir(*names):
    return [read(os.path.join(ARROW, *n.split("/"))) for n in names]


_saved = arrow_dir("saved/state.json", "saved/dataset_info.json", "saved/data-00000-of-00003.arrow",
                   "saved/data-00001-of-00003.arrow", "saved/data-00002-of-00003.arrow")
_dict_train = arrow_dir("dict/train/state.json", "dict/train/dataset_info.json", "dict/train/data-00000-of-00002.arrow",
                        "dict/train/data-00001-of-00002.arrow")
put("dataset_arrow", "saved_alpaca", SEP.join([b"sa"] + _saved))
put("dataset_arrow", "saved_alpaca_slice", SEP.join([b"satrain[10%:-3]"] + _saved))
put("dataset_arrow", "saved_alpaca_sum", SEP.join([b"satrain[:2]+train[-25%:](closest)"] + _saved))
put("dataset_arrow", "dict_completion", SEP.join([b"dctrain[:50%]"] + arrow_dir("dict/dataset_dict.json") + _dict_train))
put("dataset_arrow", "formatted_completion", SEP.join([b"sc"] + arrow_dir("formatted/state.json", "formatted/dataset_info.json",
                                                                          "formatted/data-00000-of-00001.arrow")))
put("dataset_arrow", "cache_completion", SEP.join([b"cctrain[-4:]"] + arrow_dir("cache/dataset_info.json", "cache/json-train.arrow")))
put("dataset_arrow", "saved_pretokenized", SEP.join([b"sp"] + _saved))

# --- hub_snapshot: a model ID, refs/main, the snapshot's index, its entries (tests/fuzz/hub_snapshot.cpp).
_commit = b"0123456789abcdef0123456789abcdef01234567"
_index = json.dumps({"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                                    "b": "model-00002-of-00002.safetensors"}}).encode()
put("hub_snapshot", "complete", SEP.join([b"Qwen/Qwen3-8B", _commit, b"", b"config.json\nmodel.safetensors\ntokenizer.json"]))
put("hub_snapshot", "sharded", SEP.join([b"org/model-x.1", _commit, _index,
                                         b"config.json\nmodel-00001-of-00002.safetensors\nmodel-00002-of-00002.safetensors"]))
put("hub_snapshot", "missing_shard", SEP.join([b"org/m", _commit, _index, b"config.json\nmodel-00001-of-00002.safetensors\n"
                                                                            b"model-00002-of-00002.safetensors~"]))
put("hub_snapshot", "dangling", SEP.join([b"org/m", _commit, b"", b"config.json>\nmodel.safetensors"]))
put("hub_snapshot", "by_commit", SEP.join([b"org/m@" + _commit, b"", b"", b"config.json\nmodel.safetensors"]))
put("hub_snapshot", "branch", SEP.join([b"org/m@dev", _commit, b"", b"config.json\nmodel.safetensors"]))
put("hub_snapshot", "bad_ref", SEP.join([b"org/m", b"../../../etc", b"", b"config.json\nmodel.safetensors"]))
put("hub_snapshot", "not_an_id", SEP.join([b"org--x/m..", _commit, b"", b"config.json"]))

# every harness also replays its regression inputs (tests/fuzz/regressions/<harness>/)
for h in os.listdir(OUT):
    reg = os.path.join(ROOT, "tests", "fuzz", "regressions", h)
    os.makedirs(reg, exist_ok=True)
    open(os.path.join(reg, ".gitkeep"), "a").close()
print("seeds:", {h: len(os.listdir(os.path.join(OUT, h))) for h in sorted(os.listdir(OUT))})
