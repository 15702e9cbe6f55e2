#!/usr/bin/env python3
"""SFT-like training data for the step benchmark: `completion` rows ({"prompt", "answer"}) whose token lengths
follow a chosen distribution, generated deterministically from a seed (issue 41: "benchmarks that look like use").

Each sample is, as axengine's `completion` type builds it (core/src/data/prompt_dataset.hpp), [BOS] prompt answer
[EOS], the prompt without loss. A sample's total length T (BOS and EOS included) is drawn, then split into a
prompt of a uniform 10-50 % of the text tokens and an answer of the rest; both are English-looking text made of
words from a fixed list, tokenised here with the model dir's tokenizer.json (the `tokenizers` package, which
axengine's tokenizer equals) so every sample has exactly its drawn length.

  --kind sft   T ~ log-normal with mean --mean (default 500) and shape --sigma (default 1.0, i.e. the median is
               mean / e^(sigma^2 / 2) ~ 303 tokens), clipped to [--min, --max] = [16, 4096]: the body of a
               typical instruction/chat SFT set with a tail of long answers up to 4k (about 0.5 % of samples
               reach the clip). Packed into rows of 4096 these make rows of ~8-16 samples.
  --kind long  every sample exactly --tokens T tokens: with data.sequence_len = T each row is one sample, no
               padding (the long-context runs: one document per row).

Writes OUT/train.jsonl, OUT/eval.jsonl (--eval-rows samples of the same kind) and OUT/lengths.json (the
parameters and the realised length statistics: mean, percentiles, a histogram). A dir whose lengths.json holds
the same parameters is reused.

usage: make_sft_data.py --tokenizer-from MODEL_DIR --out DIR [--kind sft|long] [--rows N] [--eval-rows N]
       [--seed 1] [--mean 500 --sigma 1.0 --min 16 --max 4096 | --tokens T]
"""
import argparse
import json
import math
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from packed_rows import special_ids  # noqa: E402

# Common English words: the text looks like prose to the tokenizer (mostly one or two tokens a word).
WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there been one all we their has would when if so no will more can who said about "
         "what up its into them than time could only new some these two may first then do any like my now over "
         "such our man me even most made after also did many before must through back years where much your way "
         "well down should because each just those people how too little state good very make world still own "
         "see men work long get here between both life being under never day same another know while last might "
         "us great old year off come since against go came right used take three model train data answer value "
         "function return number result list first step question explain example code reason").split()


def lognormal_lengths(rng, n, mean, sigma, lo, hi):
    """n lengths ~ exp(N(mu, sigma)) with E = mean (mu = ln(mean) - sigma^2 / 2), rounded, clipped to [lo, hi]."""
    mu = math.log(mean) - sigma * sigma / 2
    return [min(hi, max(lo, round(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


class TextMaker:
    """Text of exactly n tokens (encoded alone, without special tokens, as axengine encodes a prompt or answer)."""

    def __init__(self, tok, rng):
        self.tok, self.rng = tok, rng
        # Per-word token counts with the leading space they have inside a text: a byte-level pre-tokenizer splits
        # at spaces, so a text's count is the sum of its words' (checked below, fixed up when it is not).
        self.cost = {w: len(tok.encode(" " + w, add_special_tokens=False).ids) for w in WORDS}
        self.dot = self.count(" the.") - self.count(" the")

    def count(self, text):
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def make(self, n):
        words, used = [], 0
        while True:
            w = self.rng.choice(WORDS)
            c = self.cost[w]
            if len(words) % 12 == 11:  # a sentence ends
                w, c = w + ".", c + self.dot
            if used + c > n - 2:  # leave room for the fix-up digits
                break
            words.append(w)
            used += c
        text = " ".join(words)
        # Fill to n with digits glued to the last word: each digit is a token of its own in Qwen-style
        # pre-tokenizers; the loop checks rather than trusts that.
        got = self.count(text) if text else 0
        for _ in range(64):
            if got == n:
                return text
            if got < n:
                text += str(self.rng.randrange(10)) * (n - got) if text else "7" * n
            else:
                text = text[:-1] if len(text) > 1 else text
            got = self.count(text)
        raise SystemExit(f"make_sft_data: could not make a text of exactly {n} tokens with this tokenizer")


def make_rows(tok, specials, lengths, rng):
    maker = TextMaker(tok, rng)
    n_special = sum(1 for s in specials if s >= 0)
    rows = []
    for total in lengths:
        body = total - n_special
        prompt = max(1, round(body * rng.uniform(0.1, 0.5)))
        rows.append({"prompt": maker.make(prompt), "answer": maker.make(body - prompt)})
    return rows


def describe(lengths):
    s = sorted(lengths)
    q = lambda p: s[min(len(s) - 1, int(p * len(s)))]  # noqa: E731
    edges = [0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 1 << 40]
    hist = {f"{a}-{b}": sum(a < x <= b for x in s) for a, b in zip(edges, edges[1:]) if any(a < x <= b for x in s)}
    return {"samples": len(s), "tokens": sum(s), "mean": round(statistics.fmean(s), 1), "min": s[0],
            "p10": q(0.1), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": s[-1], "histogram": hist}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer-from", required=True, help="a model dir with tokenizer.json and tokenizer_config.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--kind", choices=("sft", "long"), default="sft")
    ap.add_argument("--rows", type=int, default=1200)
    ap.add_argument("--eval-rows", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mean", type=float, default=500.0)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--min", type=int, default=16)
    ap.add_argument("--max", type=int, default=4096)
    ap.add_argument("--tokens", type=int, help="--kind long: every sample's length")
    args = ap.parse_args()
    if args.kind == "long" and not args.tokens:
        ap.error("--kind long needs --tokens")
    params = {"kind": args.kind, "rows": args.rows, "eval_rows": args.eval_rows, "seed": args.seed}
    params.update({"tokens": args.tokens} if args.kind == "long" else
                  {"distribution": "lognormal", "mean": args.mean, "sigma": args.sigma, "min": args.min, "max": args.max})
    meta_path = os.path.join(args.out, "lengths.json")
    if os.path.exists(meta_path) and json.load(open(meta_path)).get("params") == params:
        print(f"make_sft_data: {args.out} exists with these parameters, reused")
        return

    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.tokenizer_from, "tokenizer.json"))
    bos, eos, _ = special_ids(args.tokenizer_from, tok)
    rng = random.Random(args.seed)
    n = args.rows + args.eval_rows
    if args.kind == "long":
        lengths = [args.tokens] * n
    else:
        lengths = lognormal_lengths(rng, n, args.mean, args.sigma, args.min, args.max)
    rows = make_rows(tok, (bos, eos), lengths, rng)
    os.makedirs(args.out, exist_ok=True)
    for name, part in (("train.jsonl", rows[:args.rows]), ("eval.jsonl", rows[args.rows:])):
        with open(os.path.join(args.out, name), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in part)
    meta = {"params": params, "train": describe(lengths[:args.rows]),
            "note": "lengths in tokens of [BOS] prompt answer [EOS], as axengine's completion type builds them"}
    json.dump(meta, open(meta_path, "w"), indent=1)  # last: its presence means the files are complete
    print(f"make_sft_data: {args.out}: {json.dumps(meta['train'])}")


if __name__ == "__main__":
    main()
