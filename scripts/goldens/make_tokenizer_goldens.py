#!/usr/bin/env python3
"""Trains small BPE tokenizers with HF `tokenizers` and records how HF encodes and decodes a multilingual test
set, so that tests/unit/tokenizer_*.cpp can check axengine's tokenizer.json implementation against the real thing.

Writes tests/data/tokenizers/<name>/{tokenizer.json, tokenizer_config.json, expected.json} for:
  qwen2_bytelevel        NFC + Split(Qwen2 regex) + ByteLevel(use_regex=false), special and added tokens
                         (lstrip/rstrip, single_word, a normalized one)
  llama3_bytelevel       NFKC + Split(Llama 3 regex) + ByteLevel, ignore_merges with whole-word vocab entries
                         that no merge path reaches, TemplateProcessing bos
  llama2_metaspace       Prepend/Replace normalizers, no pre-tokenizer, byte_fallback (<0x..> tokens), merges as
                         "a b" strings, decoders Replace/ByteFallback/Fuse/Strip, TemplateProcessing "<s> $A"
  mistral_metaspace_unk  Metaspace pre-tokenizer (prepend_scheme first, split false) and decoder, unk_token with
                         fuse_unk and no byte fallback
  transformers_qwen2     what transformers 5's Qwen2Tokenizer / LlamaTokenizer write around the vocabularies above
  transformers_llama     (the families' real pipelines, e.g. Llama's Metaspace prepend_scheme "first")
  *_variant              the vocabularies above under the other supported components: GPT-2 ByteLevel with
                         regex and prefix space, NFD/NFKD/NFKC, Strip, regex Replace, every Split behavior,
                         invert, Digits, Metaspace split=true, RobertaProcessing, an eos-only template
  axengine_bytelevel     (only expected.json) the file ax::make_byte_level_tokenizer_json writes; the C++ test
                         regenerates it with AXENGINE_REGEN_GOLDENS=1 and checks its output still equals it.

Everything is generated here (no downloads) and deterministic. Run with the project venv:
  /root/.cache/axengine/venv/bin/python scripts/goldens/make_tokenizer_goldens.py
"""
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = os.path.join(ROOT, "tests", "data", "tokenizers")

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# What every tokenizer is checked on. Several strings exist to hit one rule each (noted where not obvious).
TEST_TEXTS = [
    "Hello world",
    "",
    " leading space",
    "trailing space ",
    "  multiple   spaces   inside  ",
    "\ttabs\tand\nnewlines\n\n\nend",
    "windows\r\nline\r\n endings \r\n",
    "   \n  \t \n",
    "12345678901234567890 and 3.14159, 2,718 or 1e-9",
    "phone: +1 (555) 010-9999; price $1,234.56",
    "I'm sure they'RE here, can't we'LL see? She's O'Neil's.",
    "你好，世界！这是一个测试。我们在训练分词器。",
    "日本語のテキストです。カタカナとひらがな。",
    "한국어 텍스트도 포함합니다",
    "Привет, мир! Ελληνικά γράμματα. مرحبا بالعالم. नमस्ते दुनिया. สวัสดีครับ",
    "I \u2764\ufe0f emoji \U0001F44D\U0001F3FD and families \U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 flags \U0001F3F3\ufe0f\u200d\U0001F308 \U0001F1EF\U0001F1F5",
    "e\u0301 (decomposed) vs \u00e9 (composed); A\u030a vs \u00c5; n\u0303",
    "Zalgo: Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0308\u0307l\u036e\u0312\u036bg\u030c\u0317\u035a\u031ao",
    "\u00c5ngstr\u00f6m caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u0131stanbul \u00df",
    "\uff21\uff22\uff23\uff11\uff12\uff13 \ufb01ne \u2460 \u00bd x\u00b2 \u2126",
    "def square(x):\n    return x ** 2  # comment\n\n\tif x>=0: print(f\"{x!r}\")\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>",
    "text<|endoftext|>more text <|endoftext|> <|im_start|><|im_end|>",
    "<s>[INST] What is up? [/INST] Not much.</s>",
    "<s> <unk> </s><s>",
    "mask tests: hello   <mask>   world, a<mask>b, <mask>",
    "single word: axe, axes, an axe. axe",
    "<think>reasoning</think> done",
    "hello world and hello worlds",
    "control \u0000 null \u0007 bell \u001b escape \x7f del",
    "rare: \U00013000 \U0001D518\U0001D52B\U0001D526 \ua66e \u2603 \u10e6 \U0001F9EC",
    "tokenization internationalization tokenization",
    "a" * 300,
    "ab" * 120 + " " + "\u3042" * 40,
    "mixed中文English混合123数字",
    "\u2581already has metaspace \u2581\u2581 chars",
    "ĠĠ byte-level looking Ċ chars",
]


def random_texts(n=40, seed=99):
    """Random mixes of the characters the rules care about: whitespace kinds, digits, letters of several scripts,
    combining marks, ZWJ/emoji, apostrophes, punctuation and special-token fragments."""
    rng = random.Random(seed)
    pool = (list(" \t\n\r\u00a0\u3000") + list("0123456789") + list("abcXYZ") + ["'s", "'LL", "'"] +
            list(".,!?-_/()[]{}<>|") + list("\u4e2d\u6587\u3042\ud55c\u0416\u03b1\u05d0\u0e01") +
            ["e\u0301", "\u0308", "\u00e9", "\ufb01", "\uff11"] +
            ["\U0001F600", "\U0001F468\u200d\U0001F469", "\u2764\ufe0f", "\U0001F3FD", "\U00013000"] +
            ["<|im_end|>", "<s>", "</s>", "<|endoftext|>", "<mask>", "[INST]", "\u2581", "\u0120", "<0x41>"])
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 30))) for _ in range(n)]


TEST_TEXTS += random_texts()


def make_corpus():
    """A varied corpus: prose, code, numbers, CJK, other scripts, emoji. Deterministic."""
    rng = random.Random(1234)
    words = ("the quick brown fox jumps over lazy dog hello world tokenization model training data engine "
             "learning rate batch size gradient loss value function return print import class self "
             "international language science history music water mountain river city country people "
             "time year day night morning evening computer network system memory process").split()
    cjk = list("的一是不了在人有我他这个们中来上大为和国地到以说时要就出也得里后自之去年生会可那下着学如")
    jp = list("あいうえおかきくけこさしすせそたちつてとなにぬねのカタナラワンテキスト日本語")
    ko = ["한국어", "텍스트", "안녕하세요", "감사합니다", "학습"]
    other = ["Привет", "мир", "данные", "Ελληνικά", "γράμματα", "مرحبا", "بالعالم", "नमस्ते", "दुनिया", "สวัสดี",
             "café", "naïve", "résumé", "Ångström", "straße", "İstanbul"]
    emoji = ["\U0001F600", "\U0001F44D", "\u2764\ufe0f", "\U0001F680", "\U0001F468\u200d\U0001F4BB", "\U0001F30D"]
    code = ["def f(x):\n    return x * 2\n", "for i in range(10):\n\tprint(i)\n", "if (a >= b) { c += 1; }",
            "x = [1, 2, 3]  # list", "import numpy as np\n", "const y = await fetch(url);"]
    lines = []
    for _ in range(2500):
        kind = rng.randrange(8)
        if kind <= 2:
            n = rng.randint(3, 14)
            s = " ".join(rng.choice(words) for _ in range(n))
            s = s.capitalize() + rng.choice([".", "!", "?", ",", "", "'s", " can't", " we're", " I'm"])
        elif kind == 3:
            s = "".join(rng.choice(cjk) for _ in range(rng.randint(4, 20))) + rng.choice(["。", "，", "！", ""])
        elif kind == 4:
            s = rng.choice(["".join(rng.choice(jp) for _ in range(rng.randint(3, 12))), " ".join(rng.sample(ko, 3))])
        elif kind == 5:
            s = " ".join(rng.choice(other) for _ in range(rng.randint(2, 6)))
        elif kind == 6:
            s = rng.choice(code)
        else:
            s = f"{rng.randint(0, 10**rng.randint(1, 9))} + {rng.random():.4f} = {rng.choice(emoji)} " \
                f"{rng.choice(words)}\t{rng.choice(words)}  {rng.choice(emoji)}"
        lines.append(s)
    return lines


def with_config(tok, name, config, added_checks=None):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1, ensure_ascii=False)
    return d


def record(tok, name, config, extra=None):
    """expected.json: per text the ids with and without special tokens and HF's decodes."""
    cases = []
    for text in TEST_TEXTS:
        plain = tok.encode(text, add_special_tokens=False).ids
        special = tok.encode(text, add_special_tokens=True).ids
        cases.append({
            "text": text,
            "ids": plain,
            "ids_with_special": special,
            "decoded": tok.decode(plain, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(plain, skip_special_tokens=True),
        })
    def token_id(key):
        v = config.get(key)
        if isinstance(v, dict):
            v = v["content"]
        return -1 if v is None else tok.token_to_id(v)
    expected = {
        "tokenizer": name,
        "tokenizers_version": __import__("tokenizers").__version__,
        "vocab_size": max(tok.get_vocab(with_added_tokens=True).values()) + 1,
        "bos_id": token_id("bos_token"),
        "eos_id": token_id("eos_token"),
        "pad_id": token_id("pad_token"),
        "cases": cases,
    }
    if extra:
        expected.update(extra)
    path = os.path.join(OUT, name, "expected.json")
    with open(path, "w") as f:
        json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))
    for fn in ("tokenizer.json", "expected.json", "tokenizer_config.json"):
        p = os.path.join(OUT, name, fn)
        if os.path.exists(p):
            size = os.path.getsize(p)
            assert size < 200_000, f"{p} is {size} bytes: keep goldens under 200 KB"
            print(f"  {os.path.relpath(p, ROOT)}: {size} bytes")


def train_bytelevel(corpus, pattern, normalizer, specials, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return tok


def make_qwen2(corpus):
    tok = train_bytelevel(corpus, QWEN2_PATTERN, normalizers.NFC(),
                          ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], 1400)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken("axe", single_word=True, normalized=True),
                    AddedToken("<think>", normalized=True), AddedToken("</think>", normalized=False)])
    config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "tokenizer_class": "Qwen2Tokenizer"}
    with_config(tok, "qwen2_bytelevel", config)
    return tok, config


def make_llama3(corpus):
    tok = train_bytelevel(corpus, LLAMA3_PATTERN, normalizers.NFKC(),
                          ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], 1200)
    data = json.loads(tok.to_str())
    # Whole words in the vocabulary that the merges cannot build: only ignore_merges finds them.
    vocab = data["model"]["vocab"]
    next_id = max(vocab.values()) + 1
    for word in ["Ġtokenization", "Ġinternationalization", "Ġworlds", "Ġhello", "ĠÄŁ"]:
        if word not in vocab:
            vocab[word] = next_id
            next_id += 1
    for t in data["added_tokens"]:
        assert t["id"] < min(v for k, v in vocab.items() if k.startswith("Ġ")), "specials come first"
    data["model"]["ignore_merges"] = True
    with_merges = Tokenizer.from_str(json.dumps(data))
    data["model"]["ignore_merges"] = False
    without = Tokenizer.from_str(json.dumps(data))
    differs = sum(with_merges.encode(t).ids != without.encode(t).ids for t in TEST_TEXTS)
    assert differs > 0, "ignore_merges must change some encodings, or the test proves nothing"
    print(f"  llama3: ignore_merges changes {differs} of {len(TEST_TEXTS)} encodings")
    tok = with_merges
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": None}
    with_config(tok, "llama3_bytelevel", config)
    return tok, config


def train_metaspace(corpus):
    """A SentencePiece-like BPE: trained on Metaspace words, with a limited alphabet so that rare characters
    are left to byte fallback / unk."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never", split=True)
    trainer = trainers.BpeTrainer(vocab_size=1300, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=180,
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    data = json.loads(tok.to_str())
    trained = sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])
    return [k for k, _ in trained if k not in ("<unk>", "<s>", "</s>")], data["model"]["merges"]


def metaspace_model_json(tokens, merges, byte_fallback):
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    if byte_fallback:
        for b in range(256):
            vocab[f"<0x{b:02X}>"] = len(vocab)
    for t in tokens:
        vocab.setdefault(t, len(vocab))
    return {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": byte_fallback, "ignore_merges": False,
            "vocab": vocab, "merges": [" ".join(m) for m in merges]}  # the older "a b" form, as Llama 2 ships


SPECIALS_LLAMA = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                   "normalized": False, "special": True} for i, c in enumerate(["<unk>", "<s>", "</s>"])]


def make_llama2(tokens, merges):
    data = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": SPECIALS_LLAMA,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": metaspace_model_json(tokens, merges, byte_fallback=True),
    }
    tok = Tokenizer.from_str(json.dumps(data))
    tok.add_special_tokens([AddedToken("[INST]", special=True, normalized=False),
                            AddedToken("[/INST]", special=True, normalized=False)])
    tok.add_tokens([AddedToken("hello world", normalized=True)])  # matched as "▁hello▁world" after normalizing
    config = {"bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False, "normalized": False,
                            "rstrip": False, "single_word": False},
              "eos_token": "</s>", "pad_token": None, "unk_token": "<unk>", "add_bos_token": True}
    with_config(tok, "llama2_metaspace", config)
    return tok, config


def make_mistral_unk(tokens, merges):
    model = metaspace_model_json(tokens, merges, byte_fallback=False)
    model["merges"] = [list(m) for m in merges]
    data = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": SPECIALS_LLAMA,
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                                              "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}},
        "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False},
        "model": model,
    }
    tok = Tokenizer.from_str(json.dumps(data))
    config = {}  # no names: bos/eos come from the template
    with_config(tok, "mistral_metaspace_unk", {})
    return tok, {"bos_token": "<s>", "eos_token": "</s>"}


def make_variant(base, name, changes, config):
    """The same vocabulary and merges as `base` under other pipeline components, so that every supported
    component (and split behavior) is checked against HF, not only the ones real models happen to use."""
    data = json.loads(base.to_str())
    data.update(changes)
    tok = Tokenizer.from_str(json.dumps(data))
    with_config(tok, name, config)
    return tok, config


def bytelevel_json(add_prefix_space, use_regex):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True, "use_regex": use_regex}


def variants(qwen, llama2):
    """(name, tokenizer, config) of the component variants."""
    out = []
    im_start, eot = qwen.token_to_id("<|im_start|>"), qwen.token_to_id("<|endoftext|>")
    out.append(("gpt2_bytelevel_variant",) + make_variant(qwen, "gpt2_bytelevel_variant", {
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFD"},
                                                           {"type": "Strip", "strip_left": True, "strip_right": False}]},
        "pre_tokenizer": bytelevel_json(True, True),
        "post_processor": {"type": "RobertaProcessing", "sep": ["<|endoftext|>", eot], "cls": ["<|im_start|>", im_start],
                           "trim_offsets": True, "add_prefix_space": True},
    }, {"bos_token": "<|im_start|>", "eos_token": "<|endoftext|>"}))
    out.append(("split_behaviors_variant",) + make_variant(qwen, "split_behaviors_variant", {
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFKC"}, {"type": "Replace", "pattern": {"Regex": r"\s+"}, "content": " "},
            {"type": "Strip", "strip_left": True, "strip_right": True}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"[,.!?;:]"}, "behavior": "MergedWithNext", "invert": False},
            {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False},
            {"type": "Digits", "individual_digits": False},
            {"type": "Split", "pattern": {"String": "x"}, "behavior": "Removed", "invert": False},
            {"type": "Split", "pattern": {"Regex": r"\p{L}"}, "behavior": "Contiguous", "invert": True},
            bytelevel_json(False, False)]},
        "post_processor": None,
    }, {}))
    out.append(("metaspace_split_variant",) + make_variant(llama2, "metaspace_split_variant", {
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKD"},
                                                           {"type": "Strip", "strip_left": False, "strip_right": True}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}]},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}},
    }, {"bos_token": None, "eos_token": "</s>"}))
    return out


def make_with_transformers(name, cls, vocab, merges):
    """The tokenizer.json / tokenizer_config.json that transformers itself writes for a model family (v5 builds
    the family's pipeline around a given vocabulary): the real component configuration, not our imitation."""
    d = os.path.join(OUT, name)
    cls(vocab=vocab, merges=merges).save_pretrained(d)
    for extra in os.listdir(d):
        if extra not in ("tokenizer.json", "tokenizer_config.json"):
            os.remove(os.path.join(d, extra))
    with open(os.path.join(d, "tokenizer_config.json")) as f:
        config = json.load(f)
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    # transformers' own encode must agree with the tokenizers pipeline we record (it is its backend).
    hf = __import__("transformers").AutoTokenizer.from_pretrained(d)
    for text in TEST_TEXTS:
        assert hf(text, add_special_tokens=True)["input_ids"] == tok.encode(text).ids, (name, text)
    return tok, config


def main():
    corpus = make_corpus()
    os.makedirs(OUT, exist_ok=True)
    print("training qwen2_bytelevel")
    qwen, config = make_qwen2(corpus)
    record(qwen, "qwen2_bytelevel", config)
    print("training llama3_bytelevel")
    tok, config = make_llama3(corpus)
    record(tok, "llama3_bytelevel", config)
    print("training the metaspace BPE")
    tokens, merges = train_metaspace(corpus)
    llama2, config = make_llama2(tokens, merges)
    record(llama2, "llama2_metaspace", config)
    tok, config = make_mistral_unk(tokens, merges)
    record(tok, "mistral_metaspace_unk", config)
    from transformers import LlamaTokenizer, Qwen2Tokenizer
    print("recording transformers_qwen2 / transformers_llama (files written by transformers 5)")
    qwen_model = json.loads(qwen.to_str())["model"]
    tok, config = make_with_transformers("transformers_qwen2", Qwen2Tokenizer, qwen_model["vocab"],
                                         [tuple(m) for m in qwen_model["merges"]])
    record(tok, "transformers_qwen2", config)
    llama_model = json.loads(llama2.to_str())["model"]
    tok, config = make_with_transformers("transformers_llama", LlamaTokenizer, llama_model["vocab"],
                                         [tuple(m) for m in llama_model["merges"]])
    record(tok, "transformers_llama", config)
    for name, tok, config in variants(qwen, llama2):
        print(f"recording {name}")
        record(tok, name, config)
    generated = os.path.join(OUT, "axengine_bytelevel", "tokenizer.json")
    if os.path.exists(generated):
        # Proves HF loads what ax::make_byte_level_tokenizer_json writes, and fixes what it must produce.
        print("recording axengine_bytelevel (written by the C++ generator)")
        tok = Tokenizer.from_file(generated)
        with open(os.path.join(OUT, "axengine_bytelevel", "tokenizer_config.json")) as f:
            config = json.load(f)
        record(tok, "axengine_bytelevel", config)
    else:
        print(f"note: {generated} missing; run the C++ generator test with AXENGINE_REGEN_GOLDENS=1 first",
              file=sys.stderr)


if __name__ == "__main__":
    main()
