#!/usr/bin/env python3
"""The HF transformers + peft peer of an axengine bench config: the same model dir, tokens, LoRA and optimizer.

Reads the axengine TOML (model, data, sequence_len, micro_batch_size, seed, lr, LoRA r/alpha/targets,
max_grad_norm) and trains the model as an HF user would: transformers (bf16, attn_implementation="sdpa";
MoE experts "grouped_mm") + peft LoRA + fused torch AdamW + clip_grad_norm_. Variants: eager, and
torch.compile of each decoder layer. Writes a JSON of rows to --out.

--qlora: the QLoRA peer of axengine's `model.weight_format = "nf4"` run. transformers loads the model with
bitsandbytes (BitsAndBytesConfig load_in_4bit, nf4, double quant as --double-quant, blocksize 64, compute
dtype = the config's dtype): every nn.Linear but lm_head becomes a bnb Linear4bit, which is exactly the set
axengine packs on a dense model (embeddings, lm_head and norms stay bf16 on both). On a transformers-5 MoE
model the experts are fused nn.Parameters, not nn.Linear, so bnb leaves them (and the router) in bf16: only
attention is 4-bit there, and the row's `base` says how many parameters that is. peft's
prepare_model_for_kbit_training is deliberately NOT called: it casts every non-quantised parameter (norms,
embeddings, lm_head) to fp32 and turns on gradient checkpointing, neither of which axengine's run does; the
LoRA adapters are fp32 on both sides (peft's autocast_adapter_dtype). If bitsandbytes cannot be imported the
peer says so, writes a JSON with no rows and a `skipped` reason, and exits 0.

Batches: axengine's own packed rows (packed_rows.py), fed as [B, S] input_ids + labels + position_ids that
restart at 0 per sample. transformers then builds a block-diagonal causal mask from the position_ids
(masking_utils.find_packed_sequence_indices), so every sample attends only to itself, as in axengine's
varlen attention: the same tokens, the same loss, the same attention math. sdpa runs that mask with its
masked (memory-efficient) kernel; a plain causal [B, S] batch would let samples see each other and is
not the same computation.

usage: hf_peer.py CONFIG.toml --out peer.json [--variants eager,compile] [--device cuda] [--warmup 5] [--steps N]
       [--max-warmup 25] [--qlora [--double-quant 0|1]]
       [--model DIR --data JSONL --seq-len N --batch N]   (overrides, for a small test on CPU)
"""
import argparse
import json
import os
import statistics
import sys
import time
import tomllib
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from packed_rows import AxengineBatches  # noqa: E402


def read_config(path, args):
    """The axengine config's values the peer needs, with axengine's defaults (core/src/train/*config*)."""
    cfg = tomllib.load(open(path, "rb"))
    base = os.path.dirname(os.path.abspath(path))
    rel = lambda p: p if os.path.isabs(p) else os.path.join(base, p)  # noqa: E731
    train, lora, ds = cfg.get("train", {}), cfg.get("lora", {}), cfg["datasets"][0]
    if train.get("grad_accum", 1) != 1 or train.get("schedule", "cosine") != "constant" or train.get("warmup_steps", 0):
        sys.exit("hf_peer: the config must have grad_accum = 1 and a constant lr without warmup")
    if ds.get("type") != "completion" or not ds.get("eval_path") or ds.get("prompt_field") != "prompt":
        sys.exit("hf_peer: packed_rows.py mirrors a completion dataset with prompt_field = \"prompt\" and eval_path")
    opt = cfg.get("optimizer", {})
    return {
        "model": args.model or rel(cfg["model"]["path"]),
        "dtype": {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[cfg["model"].get("dtype", "bf16")],
        "data": args.data or rel(ds["path"]),
        "seq_len": args.seq_len or cfg["data"]["sequence_len"],
        "batch": args.batch or train.get("micro_batch_size", 1),
        "seed": cfg.get("run", {}).get("seed", 1),
        "max_steps": train.get("max_steps", 0),
        "lr": train.get("lr", 2e-4),
        "weight_decay": train.get("weight_decay", 0.0),
        "max_grad_norm": train.get("max_grad_norm", 1.0),
        "betas": (opt.get("beta1", 0.9), opt.get("beta2", 0.999)),
        "eps": opt.get("eps", 1e-8),
        "r": lora.get("r", 16),
        "alpha": lora.get("alpha", 32),
        "dropout": lora.get("dropout", 0.0),
        "targets": lora.get("targets", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    }


def lora_config(c, is_moe):
    """peft LoRA as axengine places it (docs/models.md). On transformers 5 MoE models the experts are fused
    [E, N, K] parameters: gate_proj + up_proj become one LoRA of rank 2r, alpha 2·alpha on gate_up_proj and
    down_proj one on experts.down_proj (what peft >= 0.21 converts target_modules to; spelled out here so an
    older peft does the same)."""
    from peft import LoraConfig

    targets, params, rank, alpha = list(c["targets"]), [], {}, {}
    if is_moe:
        if "gate_proj" in targets and "up_proj" in targets:
            targets = [t for t in targets if t not in ("gate_proj", "up_proj")]
            params.append("gate_up_proj")
            rank[r".*\.gate_up_proj"], alpha[r".*\.gate_up_proj"] = 2 * c["r"], 2 * c["alpha"]
        if "down_proj" in targets:
            targets.remove("down_proj")
            params.append("down_proj")
    kw = {"target_parameters": params, "rank_pattern": rank, "alpha_pattern": alpha} if params else {}
    # peft checks the patterns against module names only and warns that they match nothing; they do apply to
    # the expert parameter (the trainable count equals axengine's: 2r on gate_up_proj).
    warnings.filterwarnings("ignore", message="The following (rank|alpha)_pattern keys did not match")
    return LoraConfig(r=c["r"], lora_alpha=c["alpha"], lora_dropout=c["dropout"], target_modules=targets,
                      bias="none", task_type="CAUSAL_LM", **kw)


def bnb_config(c, double_quant):
    """bitsandbytes 4-bit as axengine's weight_format = "nf4" packs: nf4 codes, blocks of 64 (bnb's fixed 4-bit
    blocksize, axengine's default quant_blocksize), absmax double-quantised or not, the compute in the
    config's dtype. transformers keeps lm_head out by default (its modules_to_not_convert), as axengine does."""
    import transformers
    return transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                           bnb_4bit_use_double_quant=double_quant, bnb_4bit_compute_dtype=c["dtype"],
                                           bnb_4bit_quant_storage=torch.uint8)


def base_stats(model):
    """The frozen base as it sits in memory, counted as axengine's `base weights` line counts it: parameters in
    total and in bnb 4-bit (logical counts: a 4-bit [N, K] weight is N*K), and the bytes of every tensor that
    holds them (packed codes, absmax, the nested absmax and its fp32 scales, code tables, offsets; a storage
    shared between tensors once, so tied weights count once)."""
    import bitsandbytes as bnb
    seen = set()

    def nbytes(t):
        if t is None or not torch.is_tensor(t):
            return 0
        key = (t.device, t.untyped_storage().data_ptr())
        if key in seen:
            return 0
        seen.add(key)
        return t.untyped_storage().nbytes()

    params = packed = total = packed_bytes = 0
    for name, p in model.named_parameters():
        if "lora_" in name:
            continue
        qs = p.quant_state if isinstance(p, bnb.nn.Params4bit) else None
        if qs is None:
            params, total = params + p.numel(), total + nbytes(p)
            continue
        b = nbytes(p) + nbytes(qs.absmax) + nbytes(qs.code) + nbytes(getattr(qs, "offset", None))
        if qs.nested:
            b += nbytes(qs.state2.absmax) + nbytes(qs.state2.code)
        n = qs.shape.numel()
        params, packed, total, packed_bytes = params + n, packed + n, total + b, packed_bytes + b
    return {"format": "bnb nf4", "params": params, "packed_params": packed, "bytes": total,
            "bytes_per_param": round(total / params, 4) if params else None,
            "packed_bytes_per_param": round(packed_bytes / packed, 4) if packed else None}


def load_model(c, device, qlora=False, double_quant=True):
    import transformers
    from peft import get_peft_model

    mcfg = json.load(open(os.path.join(c["model"], "config.json")))
    is_moe = bool(mcfg.get("num_experts") or mcfg.get("num_local_experts"))
    kw = {"experts_implementation": "grouped_mm"} if is_moe else {}
    if qlora:
        kw["quantization_config"] = bnb_config(c, double_quant)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        c["model"], dtype=c["dtype"], attn_implementation="sdpa", device_map=device, **kw)
    model.config.use_cache = False
    model = get_peft_model(model, lora_config(c, is_moe))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    return model, params, is_moe


def compile_layers(model):
    """torch.compile of each decoder layer, the usual way to compile an HF model for training. dynamo's
    defaults (recompile_limit 8) stay: peft's expert LoRA re-registers a parametrization every forward,
    so a MoE layer recompiles until that limit leaves those frames eager; train() waits that out."""
    layers = model.get_base_model().model.layers
    for i, layer in enumerate(layers):
        layers[i] = torch.compile(layer)


def graphs_compiled():
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def train(model, params, batch, c, device, warmup, steps, max_warmup):
    """At least `warmup` steps, more (up to max_warmup) until one compiles no new graph, then `steps` timed
    steps, each from the batch copy to the end of its GPU work. Returns step times, losses, warm-up steps and
    graphs compiled while timing (0 unless max_warmup ran out)."""
    opt = torch.optim.AdamW(params, lr=c["lr"], betas=c["betas"], eps=c["eps"], weight_decay=c["weight_decay"],
                            fused=True)
    cuda = device.startswith("cuda")
    times, losses, warm, step = [], [], None, 0
    graphs_at_warm = 0
    while len(times) < steps:
        ids, labels, pos, _ = batch(step)
        g0, t0 = graphs_compiled(), time.perf_counter()
        ids, labels, pos = (x.to(device, non_blocking=True) for x in (ids, labels, pos))
        loss = model(input_ids=ids, labels=labels, position_ids=pos, use_cache=False).loss
        loss.backward()
        if c["max_grad_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(params, c["max_grad_norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if warm is not None:
            times.append(dt)
        elif step + 1 >= max_warmup or (step + 1 >= warmup and graphs_compiled() == g0):
            warm, graphs_at_warm = step + 1, graphs_compiled()
        step += 1
        print(f"  step {step}: loss {losses[-1].item():.4f}  {1e3 * dt:.1f} ms", flush=True)
    del opt
    return times, [l.item() for l in losses], warm, graphs_compiled() - graphs_at_warm


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default="eager,compile")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, help="timed steps (default: the config's max_steps - warmup, as axengine)")
    ap.add_argument("--max-warmup", type=int, default=25, help="warm-up steps at most, waiting for compiles to end")
    ap.add_argument("--qlora", action="store_true", help="the base in bitsandbytes nf4 (HF + peft + bitsandbytes QLoRA)")
    ap.add_argument("--double-quant", type=int, choices=(0, 1), default=1,
                    help="with --qlora: bnb_4bit_use_double_quant, as axengine's model.double_quant")
    ap.add_argument("--model")
    ap.add_argument("--data")
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--batch", type=int)
    args = ap.parse_args()
    c = read_config(args.config, args)
    device, cuda = args.device, args.device.startswith("cuda")
    steps = args.steps or c["max_steps"] - args.warmup
    if steps <= 0:
        sys.exit("hf_peer: no timed steps (give --steps, or a config with max_steps > --warmup)")
    torch.manual_seed(c["seed"])
    if args.qlora:
        try:
            import bitsandbytes
        except Exception as e:  # ImportError, or a broken native library: either way no QLoRA peer here
            reason = f"bitsandbytes is not importable ({type(e).__name__}: {e}); the HF QLoRA peer is skipped"
            print(f"hf_peer: {reason}", flush=True)
            json.dump({"rows": [], "skipped": reason, "qlora": True, "batch": [c["batch"], c["seq_len"]]},
                      open(args.out, "w"), indent=1)
            return

    t = time.perf_counter()
    data = AxengineBatches(c["data"], c["model"], c["seq_len"], c["batch"], c["seed"])
    cache = {}

    def batch(step):  # built once per step on the CPU, outside the timed region; pinned for async copies
        if step not in cache:
            cache[step] = tuple(x.pin_memory() if cuda and torch.is_tensor(x) else x for x in data.batch(step))
        return cache[step]

    print(f"hf_peer: {len(data.samples)} samples -> {len(data.rows)} rows of {c['seq_len']} ({time.perf_counter() - t:.1f} s)")

    t = time.perf_counter()
    model, params, is_moe = load_model(c, device, args.qlora, bool(args.double_quant))
    lora_init = [p.detach().clone() for p in params]
    n_trainable = sum(p.numel() for p in params)
    print(f"hf_peer: loaded {c['model']} in {time.perf_counter() - t:.1f} s; {len(params)} LoRA tensors, {n_trainable} parameters")

    import peft
    import transformers
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}
    suffix = ""
    if args.qlora:
        import bitsandbytes
        versions["bitsandbytes"] = bitsandbytes.__version__
        suffix = "+bnb"
    res = {"versions": versions, "qlora": args.qlora,
           "device": torch.cuda.get_device_name() if cuda else "cpu",
           "model": c["model"], "batch": [c["batch"], c["seq_len"]], "trainable_params": n_trainable,
           "lora_dtype": str(params[0].dtype).replace("torch.", ""),  # peft keeps adapters in fp32, as axengine
           "experts_implementation": "grouped_mm" if is_moe else None,
           "attention": "sdpa; packed rows, block-diagonal causal mask from position_ids", "rows": []}
    if args.qlora:
        res["base"] = base_stats(model)
        res["quantization"] = (f"bitsandbytes nf4, blocksize 64, double_quant {bool(args.double_quant)}, compute "
                               f"{str(c['dtype']).replace('torch.', '')}; "
                               "no prepare_model_for_kbit_training (it upcasts the rest of the base to fp32)")
        print(f"hf_peer: base {res['base']}")
    for variant in args.variants.split(","):
        with torch.no_grad():  # every variant starts from the same adapter
            for p, p0 in zip(params, lora_init):
                p.copy_(p0)
        if variant == "compile":
            compile_layers(model)
        elif variant != "eager":
            sys.exit(f"hf_peer: unknown variant {variant}")
        if cuda and variant != "eager":  # eager's peak counts from process start, like axengine's
            torch.cuda.reset_peak_memory_stats()
        print(f"hf_peer: {variant}")
        t = time.perf_counter()
        times, losses, warm, late_graphs = train(model, params, batch, c, device, args.warmup, steps,
                                                 args.max_warmup)
        ms = 1e3 * statistics.median(times)
        res["rows"].append({
            "system": "hf+peft" + suffix + ("" if variant == "eager" else "+compile"), "ms_per_step": round(ms, 2),
            "tokens_per_s": round(c["batch"] * c["seq_len"] / ms * 1e3),
            "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2) if cuda else None,
            "steps_timed": len(times), "warmup_steps": warm, "first_loss": losses[0], "final_loss": losses[-1],
            "step_real_tokens": [batch(s)[3] for s in range(len(losses))], "wall_s": round(time.perf_counter() - t, 1)})
        if variant == "compile":
            res["rows"][-1].update(dynamo_graphs=graphs_compiled(), graphs_compiled_while_timed=late_graphs)
        print(json.dumps({k: v for k, v in res["rows"][-1].items() if k != "step_real_tokens"}), flush=True)
        json.dump(res, open(args.out, "w"), indent=1)  # after each variant: a later one may be cut off


if __name__ == "__main__":
    main()
