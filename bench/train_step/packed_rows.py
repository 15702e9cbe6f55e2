"""The batches axengine trains on, rebuilt in Python so the HF peer sees the same tokens.

Mirrors, for a `completion` dataset with prompt_field and eval_path (what the bench configs use):
  core/src/data/completion.cpp  sample = [bos] + encode(prompt) + encode(answer) + [eos]; no loss on bos+prompt
  core/src/data/prepare.cpp     has_loss_token(): a sample with no label past its first token within sequence_len
                                stops the run (on_bad_row's default "error"); samples longer than sequence_len
                                are cut to it when packed (pack_samples counts them: the run log's warning)
  core/src/data/packing.cpp     permutation(), mix_seed(), pack_samples() (first fit), make_batch()
  core/src/train/trainer.cpp    plan(): samples packed once in permutation(n, mix_seed(seed, 1)) order;
                                train_step(): epoch e visits rows in permutation(rows, mix_seed(seed, 0x5eed0000 + e))
If any of those change, this file must follow: hf_peer.py --check-tokens compares the per-step token counts
with axengine's metrics.jsonl, and the first step's loss (LoRA B = 0, so the base model's loss) must agree.
"""
import json
import os

import torch

M64 = (1 << 64) - 1


def mix_seed(a, b):
    z = (a + 0x9E3779B97F4A7C15 * (b + 1)) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def permutation(n, seed):
    p = list(range(n))
    state = seed
    for i in range(n, 1, -1):
        state = mix_seed(state, i)
        j = (state * i) >> 64  # the C++ multiply-shift on 128 bits
        p[i - 1], p[j] = p[j], p[i - 1]
    return p


def special_ids(model_dir, tok):
    """bos, eos, pad ids as axengine's tokenizer reads them from tokenizer_config.json (-1: none)."""
    cfg = json.load(open(os.path.join(model_dir, "tokenizer_config.json")))

    def tid(key):
        v = cfg.get(key)
        if isinstance(v, dict):  # the AddedToken form
            v = v.get("content")
        return -1 if v is None else tok.token_to_id(v)

    return tid("bos_token"), tid("eos_token"), tid("pad_token")


def load_samples(jsonl, model_dir, prompt_field="prompt", text_field="answer"):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    bos, eos, pad = special_ids(model_dir, tok)
    rows = [json.loads(line) for line in open(jsonl) if line.strip()]
    prompts = tok.encode_batch([r[prompt_field] for r in rows], add_special_tokens=False)
    texts = tok.encode_batch([r[text_field] for r in rows], add_special_tokens=False)
    samples = []
    for p, t in zip(prompts, texts):
        head = ([bos] if bos >= 0 else []) + p.ids
        ids = head + t.ids + ([eos] if eos >= 0 else [])
        samples.append((ids, [-100] * len(head) + ids[len(head):]))
    pad_id = pad if pad >= 0 else (eos if eos >= 0 else 0)
    return samples, pad_id


def pack_samples(samples, order, S):
    rows, row, used = [], [], 0
    for idx in order:
        n = min(len(samples[idx][0]), S)
        if used + n > S and row:
            rows.append(row)
            row, used = [], 0
        row.append(idx)
        used += n
    if row:
        rows.append(row)
    return rows


def make_batch(samples, rows, row_ids, S, pad_id):
    """[B, S] input_ids, labels, position_ids (restarting at 0 per sample), and the real token count."""
    B = len(row_ids)
    ids = torch.full((B, S), pad_id, dtype=torch.long)
    labels = torch.full((B, S), -100, dtype=torch.long)
    pos = torch.empty((B, S), dtype=torch.long)
    real = 0
    for b, r in enumerate(row_ids):
        t = 0
        for idx in rows[r]:
            s_ids, s_labels = samples[idx]
            n = min(len(s_ids), S - t)
            ids[b, t:t + n] = torch.tensor(s_ids[:n])
            labels[b, t:t + n] = torch.tensor(s_labels[:n])
            labels[b, t] = -100  # no sample learns to predict the start of the next one
            pos[b, t:t + n] = torch.arange(n)
            t += n
        real += t
        pos[b, t:] = torch.arange(S - t)  # padding: a span of its own, no loss
    return ids, labels, pos, real


def check_loss_tokens(samples, S, jsonl):
    """axengine's has_loss_token() with on_bad_row = "error": every sample has a label past its first token
    within the first S tokens, else the run stops naming the row (so must the peer: not the same data else)."""
    for i, (_, labels) in enumerate(samples):
        if all(x == -100 for x in labels[1:S]):
            raise SystemExit(f"{jsonl}:{i + 1}: no token to train on within data.sequence_len = {S} (axengine stops here too)")


def spans(position_ids):
    """The attention spans of each row of a [B, S] position_ids batch (samples and the padding span): the
    lengths between the zeros, as make_batch writes them (the cu_seqlens of axengine's varlen attention)."""
    out = []
    for row in position_ids.tolist():
        starts = [i for i, p in enumerate(row) if p == 0] + [len(row)]
        out.append([b - a for a, b in zip(starts, starts[1:])])
    return out


class AxengineBatches:
    """batch(step) -> (input_ids, labels, position_ids, real_tokens) for micro_batch_size rows, grad_accum = 1."""

    def __init__(self, jsonl, model_dir, S, micro_batch_size, seed):
        self.samples, self.pad_id = load_samples(jsonl, model_dir)
        check_loss_tokens(self.samples, S, jsonl)
        self._plan(S, micro_batch_size, seed)

    def _plan(self, S, micro_batch_size, seed):
        """axengine's plan of self.samples: packed once in a seeded order, each epoch's rows in their own order."""
        self.S, self.B, self.seed = S, micro_batch_size, seed
        self.rows = pack_samples(self.samples, permutation(len(self.samples), mix_seed(seed, 1)), S)
        self.steps_per_epoch = len(self.rows) // self.B
        self._epoch, self._order = None, None

    def row_ids(self, step):
        """The packed rows of step `step`."""
        epoch, k = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._epoch = epoch
            self._order = permutation(len(self.rows), mix_seed(self.seed, 0x5EED0000 + epoch))
        return self._order[k * self.B:(k + 1) * self.B]

    def batch(self, step):
        return make_batch(self.samples, self.rows, self.row_ids(step), self.S, self.pad_id)
