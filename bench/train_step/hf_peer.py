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

Variants (--variants, any of): `eager`; `compile` (torch.compile of each decoder layer); `liger` and
`liger+compile`: the strongest HF-stack setup that runs without network (issue 41), liger-kernel's
apply_liger_kernel_to_qwen3 / apply_liger_kernel_to_qwen3_moe with its defaults (RoPE, RMSNorm, SwiGLU -- on the
MoE model its fused expert kernel LigerExperts -- and the fused linear cross-entropy, so the [T, V] logits never
exist), patched into the classes before loading, and the fastest attention that keeps each sample attending to
itself only: sdpa with a plain causal mask when every row of the run is one sample with no padding (sdpa then
takes its flash/cuDNN kernels), else transformers' flex_attention, whose BlockMask from the packed position_ids
skips the blocks between samples (flash_attn, the varlen kernel, is not installed there). Liger variants are
not mixed with the others in one process (the patch is class-wide): run.sh runs them in a second process. On a
CPU they load and patch the model, then are reported as skipped (liger's kernels are Triton: GPU only).

`train.activation_checkpointing = true` in the config turns on HF's per-layer activation checkpointing
(torch.utils.checkpoint, use_reentrant=False), as axengine recomputes each layer. Out of memory (or any error)
in a variant is written as that row's `error` and the next variant runs.

MFU: the JSON has the step's matrix FLOPs per step (flops.py, same count for every system) and the device's
GEMM rate measured in this process (flops.gemm_rate: torch.matmul 8192^3 in the config's dtype); each row's
`mfu` = its timed steps' mean FLOPs / its median step time / that rate.

usage: hf_peer.py CONFIG.toml --out peer.json [--variants eager,compile] [--device cuda] [--warmup 5] [--steps N]
       [--max-warmup 25] [--qlora [--double-quant 0|1]] [--set KEY=VALUE ...]
       [--model DIR --data JSONL --seq-len N --batch N]   (overrides, for a small test on CPU)
--set takes axengine's --set syntax (`data.sequence_len=4096`, `datasets[0].path=/x.jsonl`), so run.sh gives
both systems the same overrides.
"""
import argparse
import gc
import json
import os
import re
import statistics
import sys
import time
import tomllib
import traceback
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flops  # noqa: E402
from packed_rows import AxengineBatches, spans  # noqa: E402

VARIANTS = ("eager", "compile", "liger", "liger+compile")


def apply_set(cfg, assignment):
    """One `--set KEY=VALUE` as axengine applies it (docs/config.md): a dotted key, `name[i]` indexing a list
    or an array of tables; the value read as TOML, else taken as a string."""
    key, sep, raw = assignment.partition("=")
    if not sep:
        sys.exit(f"hf_peer: --set {assignment}: expected KEY=VALUE")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    parts = []
    for part in key.split("."):
        m = re.fullmatch(r"([^\[]+)((?:\[\d+\])*)", part)
        if not m:
            sys.exit(f"hf_peer: --set {assignment}: bad key")
        parts.append(m.group(1))
        parts += [int(i) for i in re.findall(r"\[(\d+)\]", m.group(2))]
    node = cfg
    for p in parts[:-1]:
        node = node[p] if isinstance(p, int) else node.setdefault(p, {})
    node[parts[-1]] = value


def read_config(path, args, check_dataset=True):
    """The axengine config's values the peer needs, with axengine's defaults (core/src/train/*config*).
    check_dataset: the dataset must be the completion one packed_rows.py mirrors (bench/vlm_sft's peer reads a
    chat_template one and checks it itself)."""
    cfg = tomllib.load(open(path, "rb"))
    for assignment in args.set:
        apply_set(cfg, assignment)
    base = os.path.dirname(os.path.abspath(path))
    rel = lambda p: p if os.path.isabs(p) else os.path.join(base, p)  # noqa: E731
    train, lora, ds = cfg.get("train", {}), cfg.get("lora", {}), cfg["datasets"][0]
    if train.get("grad_accum", 1) != 1 or train.get("schedule", "cosine") != "constant" or train.get("warmup_steps", 0):
        sys.exit("hf_peer: the config must have grad_accum = 1 and a constant lr without warmup")
    if check_dataset and (ds.get("type") != "completion" or not ds.get("eval_path") or ds.get("prompt_field") != "prompt"):
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
        "checkpointing": bool(train.get("activation_checkpointing", False)),
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


def apply_liger(is_moe, model_type, experts):
    """liger-kernel's patch for this family with its defaults (rope, rms_norm, swiglu, fused linear
    cross-entropy), class-wide, before the model is built: peft then wraps the Liger MLP's projections.
    experts = "grouped_mm" keeps transformers' experts on a MoE model (swiglu off: it is what replaces them)."""
    from liger_kernel.transformers import apply_liger_kernel_to_qwen3, apply_liger_kernel_to_qwen3_moe
    patch = {"qwen3": apply_liger_kernel_to_qwen3, "qwen3_moe": apply_liger_kernel_to_qwen3_moe}.get(model_type)
    if patch is None:
        raise RuntimeError(f"no liger patch wired here for model_type {model_type!r} (qwen3, qwen3_moe)")
    patch(rope=True, rms_norm=True, swiglu=not (is_moe and experts == "grouped_mm"), cross_entropy=False,
          fused_linear_cross_entropy=True)
    return patch.__name__


def load_model(c, device, qlora=False, double_quant=True, liger=False, attn="sdpa", liger_experts="liger",
               auto_class="AutoModelForCausalLM", lora_exclude=None):
    """The model as the peer trains it. auto_class, lora_exclude: bench/vlm_sft's peer loads a VLM
    (AutoModelForImageTextToText) with its vision tower kept out of LoRA (peft's exclude_modules)."""
    import transformers
    from peft import get_peft_model

    mcfg = json.load(open(os.path.join(c["model"], "config.json")))
    is_moe = bool(mcfg.get("num_experts") or mcfg.get("num_local_experts"))
    # Liger replaces the experts class with its fused kernel (LigerExperts), which has no experts_implementation.
    kw = {"experts_implementation": "grouped_mm"} if is_moe and (not liger or liger_experts == "grouped_mm") else {}
    if qlora:
        kw["quantization_config"] = bnb_config(c, double_quant)
    patched = apply_liger(is_moe, mcfg.get("model_type"), liger_experts) if liger else None
    model = getattr(transformers, auto_class).from_pretrained(
        c["model"], dtype=c["dtype"], attn_implementation=attn, device_map=device, **kw)
    model.config.use_cache = False
    if c["checkpointing"]:  # per decoder layer, non-reentrant (transformers 5.17's name; later ones renamed it)
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = lora_config(c, is_moe)
    if lora_exclude:
        lora.exclude_modules = lora_exclude
    model = get_peft_model(model, lora)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    setup = {"attention": attn, "experts_implementation": kw.get("experts_implementation"),
             "activation_checkpointing": c["checkpointing"]}
    if patched:  # what the patch replaced, under peft's wrappers: evidence that liger's modules run
        layer = model.get_base_model().model.layers[0]
        base = lambda m: base(m.base_layer) if hasattr(m, "base_layer") else m  # noqa: E731
        setup.update(liger=patched, liger_modules={
            "mlp": type(layer.mlp).__name__, "experts": type(base(getattr(layer.mlp, "experts", None))).__name__,
            "norm": type(layer.input_layernorm).__name__,
            "causal_lm_forward": type(model.get_base_model()).forward.__module__})
    return model, params, is_moe, setup


class Layers:
    """The decoder layers, compiled (torch.compile of each layer, the usual way to compile an HF model for
    training) or as loaded. dynamo's defaults (recompile_limit 8) stay: peft's expert LoRA re-registers a
    parametrization every forward, so a MoE layer recompiles until that limit leaves those frames eager;
    train() waits that out."""

    def __init__(self, model, layers=None):
        self.layers = layers if layers is not None else model.get_base_model().model.layers
        self.plain = list(self.layers)
        self.compiled = None

    def use(self, compiled):
        if compiled and self.compiled is None:
            for layer in self.plain:
                keep_liger_experts_eager(layer)
            self.compiled = [torch.compile(layer) for layer in self.plain]
        for i, layer in enumerate(self.compiled if compiled else self.plain):
            self.layers[i] = layer


def keep_liger_experts_eager(layer):
    """liger-kernel 0.8.5's fused MoE experts (LigerExperts) run outside dynamo, inside the compiled layer. Traced,
    dynamo's Triton-kernel analysis fails on liger's kernel, breaks the graph there, and its resumed frame then adds
    the experts' [T, H] output to the [B, S, H] residual (H100, 2026-12-08, docs/performance.md): the
    liger+compile peer died on the first step. Eager experts are what a user of that stack gets to run."""
    for m in layer.modules():
        if m._get_name() == "LigerExperts" and not getattr(m, "_ax_eager", False):
            m.forward = torch.compiler.disable(m.forward)
            m._ax_eager = True


def graphs_compiled():
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def text_inputs(b):
    """The model's inputs of a packed_rows batch (input_ids, labels, position_ids, real tokens)."""
    return {"input_ids": b[0], "labels": b[1], "position_ids": b[2]}


def train(model, params, batch, c, device, warmup, steps, max_warmup, inputs=text_inputs):
    """At least `warmup` steps, more (up to max_warmup) until one compiles no new graph, then `steps` timed
    steps, each from the batch copy to the end of its GPU work. inputs(batch(step)): the forward's tensor
    arguments (copied to the device inside the timed step). Returns step times, losses, warm-up steps and
    graphs compiled while timing (0 unless max_warmup ran out)."""
    opt = torch.optim.AdamW(params, lr=c["lr"], betas=c["betas"], eps=c["eps"], weight_decay=c["weight_decay"],
                            fused=True)
    cuda = device.startswith("cuda")
    times, losses, warm, step = [], [], None, 0
    graphs_at_warm = 0
    try:
        while len(times) < steps:
            step_inputs = inputs(batch(step))
            g0, t0 = graphs_compiled(), time.perf_counter()
            step_inputs = {k: x.to(device, non_blocking=True) for k, x in step_inputs.items()}
            loss = model(**step_inputs, use_cache=False).loss
            loss.backward()
            if c["max_grad_norm"] > 0:
                torch.nn.utils.clip_grad_norm_(params, c["max_grad_norm"])
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach())
            del loss
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if warm is not None:
                times.append(dt)
            elif step + 1 >= max_warmup or (step + 1 >= warmup and graphs_compiled() == g0):
                warm, graphs_at_warm = step + 1, graphs_compiled()
            step += 1
            print(f"  step {step}: loss {losses[-1].item():.4f}  {1e3 * dt:.1f} ms", flush=True)
    finally:  # an error (out of memory) leaves nothing of this variant behind for the next
        opt.zero_grad(set_to_none=True)
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
    ap.add_argument("--liger-experts", choices=("liger", "grouped_mm"), default="liger",
                    help="liger variants on a MoE model: liger's fused expert kernel (LigerExperts, its default) or "
                         "transformers' grouped_mm experts with the rest of liger")
    ap.add_argument("--attention", choices=("auto", "sdpa", "flex_attention"), default="auto",
                    help="auto: sdpa, except flex_attention for the liger variants on packed rows")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override (axengine's syntax)")
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
    variants = args.variants.split(",")
    if any(v not in VARIANTS for v in variants):
        sys.exit(f"hf_peer: unknown variant in {args.variants} (known: {', '.join(VARIANTS)})")
    liger = {v.startswith("liger") for v in variants}
    if len(liger) != 1 or (args.qlora and True in liger):
        sys.exit("hf_peer: liger variants run in a process of their own (the patch is class-wide), without --qlora")
    liger = liger.pop()
    res = {"qlora": args.qlora, "device": torch.cuda.get_device_name() if cuda else "cpu",
           "model": c["model"], "batch": [c["batch"], c["seq_len"]], "rows": []}

    def skip_all(reason):
        print(f"hf_peer: {reason}", flush=True)
        res["rows"] = [{"system": system_name(v, ""), "skipped": reason} for v in variants]
        res["skipped"] = reason
        json.dump(res, open(args.out, "w"), indent=1)

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
    if liger:
        try:
            import liger_kernel  # noqa: F401
        except Exception as e:
            return skip_all(f"liger-kernel is not importable ({type(e).__name__}: {e}): install its wheel (README.md)")

    # The GEMM rate first, while the device is empty.
    res["gemm"] = flops.gemm_rate(device, c["dtype"])
    print(f"hf_peer: GEMM rate {res['gemm']['flops_per_s'] / 1e12:.4g} TFLOP/s ({res['gemm']['n']}^3, {res['gemm']['dtype']})")

    t = time.perf_counter()
    data = AxengineBatches(c["data"], c["model"], c["seq_len"], c["batch"], c["seed"])
    cache = {}

    def batch(step):  # built once per step on the CPU, outside the timed region; pinned for async copies
        if step not in cache:
            cache[step] = tuple(x.pin_memory() if cuda and torch.is_tensor(x) else x for x in data.batch(step))
        return cache[step]

    n_steps = max(c["max_steps"], args.max_warmup + steps)
    row_spans = [spans(batch(s)[2]) for s in range(n_steps)]
    # One sample per row, no padding, in every step: a plain causal batch (transformers then passes no mask and
    # sdpa runs is_causal); else packed rows, which the liger variants run through flex_attention.
    packed = any(len(r) > 1 for step in row_spans for r in step)
    res["step_matrix_flops"] = [flops.step_flops(c["model"], c["targets"], c["r"], sp, c["checkpointing"])["total"]
                                for sp in row_spans]
    res["flops_parts_step1"] = flops.step_flops(c["model"], c["targets"], c["r"], row_spans[0], c["checkpointing"])
    res["rows_packed"] = packed
    print(f"hf_peer: {len(data.samples)} samples -> {len(data.rows)} rows of {c['seq_len']} "
          f"({'packed' if packed else 'one sample each, no padding'}; {time.perf_counter() - t:.1f} s)")

    attn = args.attention if args.attention != "auto" else "flex_attention" if liger and packed else "sdpa"
    t = time.perf_counter()
    model, params, is_moe, setup = load_model(c, device, args.qlora, bool(args.double_quant), liger, attn,
                                              args.liger_experts)
    n_trainable = sum(p.numel() for p in params)
    print(f"hf_peer: loaded {c['model']} in {time.perf_counter() - t:.1f} s; {len(params)} LoRA tensors, "
          f"{n_trainable} parameters; {setup}")

    import peft
    import transformers
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}
    suffix = ""
    if args.qlora:
        import bitsandbytes
        versions["bitsandbytes"] = bitsandbytes.__version__
        suffix = "+bnb"
    if liger:
        from importlib.metadata import version
        versions["liger_kernel"] = version("liger-kernel")
        import triton
        versions["triton"] = triton.__version__
    res.update(versions=versions, trainable_params=n_trainable, setup=setup,
               lora_dtype=str(params[0].dtype).replace("torch.", ""),  # peft keeps adapters in fp32, as axengine
               experts_implementation=setup["experts_implementation"],
               attention=f"{attn}; " + ("packed rows, each sample attends to itself only (block-diagonal causal "
                                        "mask from position_ids)" if packed else "one sample per row, causal"))
    if args.qlora:
        res["base"] = base_stats(model)
        res["quantization"] = (f"bitsandbytes nf4, blocksize 64, double_quant {bool(args.double_quant)}, compute "
                               f"{str(c['dtype']).replace('torch.', '')}; "
                               "no prepare_model_for_kbit_training (it upcasts the rest of the base to fp32)")
        print(f"hf_peer: base {res['base']}")
    run_variants(res, variants, model, params, Layers(model), batch, c, args, device, suffix, attn, liger)


def run_variants(res, variants, model, params, layers, batch, c, args, device, suffix, attn, liger=False,
                 inputs=text_inputs):
    """Each variant trained from the same adapter (Layers: compiled or not), its row (ms/step, tokens/s, peak
    memory, MFU from res["step_matrix_flops"] and res["gemm"], losses, the real tokens of each step: batch(s)[3])
    appended to res["rows"] and res written to args.out after each; an error (out of memory) is that row's
    `error` and the next variant runs. Shared with bench/vlm_sft/hf_peer_vlm.py."""
    cuda = device.startswith("cuda")
    steps = args.steps or c["max_steps"] - args.warmup
    lora_init = [p.detach().clone() for p in params]
    for variant in variants:
        name = system_name(variant, suffix)
        if liger and not cuda:
            res["rows"].append({"system": name, "skipped": "liger-kernel's Triton kernels need a CUDA device "
                                "(the model loaded and was patched: see setup)", "attention": attn})
            print(json.dumps(res["rows"][-1]), flush=True)
            json.dump(res, open(args.out, "w"), indent=1)
            continue
        with torch.no_grad():  # every variant starts from the same adapter
            for p, p0 in zip(params, lora_init):
                p.copy_(p0)
        layers.use(variant.endswith("compile"))
        if cuda and variant != variants[0]:  # the first variant's peak counts from process start, like axengine's
            torch.cuda.reset_peak_memory_stats()
        print(f"hf_peer: {variant}")
        t = time.perf_counter()
        row = {"system": name, "attention": attn}
        try:
            times, losses, warm, late_graphs = train(model, params, batch, c, device, args.warmup, steps,
                                                     args.max_warmup, inputs)
        except Exception as e:  # out of memory above all: the row says so and the next variant runs
            traceback.print_exc()
            row.update(error=f"{type(e).__name__}: {str(e)[:400]}", wall_s=round(time.perf_counter() - t, 1),
                       peak_memory_gb=round(torch.cuda.max_memory_allocated() / 1e9, 2) if cuda else None)
        if "error" in row:  # out of the except block: its traceback (and the step's tensors) is gone
            res["rows"].append(row)
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
            print(json.dumps(row), flush=True)
            json.dump(res, open(args.out, "w"), indent=1)
            continue
        ms = 1e3 * statistics.median(times)
        timed = res["step_matrix_flops"][warm:warm + len(times)]
        step_flops = statistics.fmean(timed)
        row.update({
            "ms_per_step": round(ms, 2), "tokens_per_s": round(c["batch"] * c["seq_len"] / ms * 1e3),
            "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2) if cuda else None,
            "matrix_tflop_per_step": round(step_flops / 1e12, 4),
            "mfu": round(step_flops / (ms / 1e3) / res["gemm"]["flops_per_s"], 4),
            "steps_timed": len(times), "warmup_steps": warm, "first_loss": losses[0], "final_loss": losses[-1],
            "step_real_tokens": [batch(s)[3] for s in range(len(losses))], "wall_s": round(time.perf_counter() - t, 1)})
        if variant.endswith("compile"):
            row.update(dynamo_graphs=graphs_compiled(), graphs_compiled_while_timed=late_graphs)
        res["rows"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "step_real_tokens"}), flush=True)
        json.dump(res, open(args.out, "w"), indent=1)  # after each variant: a later one may be cut off


def system_name(variant, suffix):
    """hf+peft[+bnb][+liger][+compile]"""
    return "hf+peft" + suffix + "".join("+" + part for part in variant.split("+") if part != "eager")


if __name__ == "__main__":
    main()
