"""bench/train_step/run.sh (the training-step benchmark of docs/performance.md) run on the CPU at toy sizes (TINY=1)
on two of issue 41's workloads, so the harness is proven before GPU time is spent on it: sft-moe (log-normal SFT
samples packed into rows) and long-dense-32k (one sample per row, activation checkpointing on both sides). Checks
that both systems ran the same tokens and start from the same loss (packed_rows.py mirrors axengine's batches),
that the data follow the documented lengths, that the MFU fields are filled from flops.py's count, that the liger
peer patched the model (or says why not) and chose the attention the README says, and that the result files say
where, when and how they were made.
usage: check_train_step_bench.py AXENGINE_BIN SCRATCH_DIR"""
import json
import os
import shutil
import subprocess
import sys

ax, scratch = sys.argv[1], sys.argv[2]
shutil.rmtree(scratch, ignore_errors=True)
os.makedirs(scratch)
here = os.path.dirname(os.path.abspath(__file__))
script = os.path.join(here, "..", "..", "bench", "train_step", "run.sh")
work, out = os.path.join(scratch, "work"), os.path.join(scratch, "out")
env = dict(os.environ, TINY="1", PYTHON=sys.executable, AXENGINE_BIN=ax, OUT=out, AX_BENCH_WORK=work)
subprocess.run(["bash", script, "sft-moe", "long-dense-32k"], env=env, check=True)
try:
    import liger_kernel  # noqa: F401
    have_liger = True
except ImportError:
    have_liger = False

# The data: log-normal SFT lengths (TINY: mean 40, clipped to [8, 256]) and long samples of exactly the row length.
sft = json.load(open(os.path.join(work, "sft-256", "lengths.json")))["train"]
assert 30 <= sft["mean"] <= 50 and sft["min"] >= 8 and sft["max"] <= 256 and sft["p50"] < sft["mean"], sft
long_ = json.load(open(os.path.join(work, "long-512", "lengths.json")))["train"]
assert long_["min"] == long_["max"] == 512, long_

for name, packed, attn in (("sft-moe", True, "flex_attention"), ("long-dense-32k", False, "sdpa")):
    res = json.load(open(os.path.join(out, f"train-step-{name}.json")))
    md = open(os.path.join(out, f"train-step-{name}.md")).read()
    assert res["device"] == "cpu" and res["date"] and res["command"].endswith(f"run.sh sft-moe long-dense-32k"), res
    assert res["command"] in md and res["date"] in md, md
    rows = {r["system"]: r for r in res["rows"]}
    assert set(rows) == {"axengine", "hf+peft", "hf+peft+liger"}, sorted(rows)
    axr, hf = rows["axengine"], rows["hf+peft"]
    for r in (axr, hf):
        assert r["ms_per_step"] > 0 and r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1, r
    assert res["same_tokens_per_step"] == {"hf+peft": True}, res["same_tokens_per_step"]
    # LoRA B starts at zero: step 1 is the base model's loss on the same tokens, on both sides.
    assert abs(axr["first_loss"] - hf["first_loss"]) < 2e-3 * abs(hf["first_loss"]), (axr, hf)
    assert axr["ratio_vs_hf_eager"] and axr["ratio_vs_strongest"] == axr["ratio_vs_hf_eager"], axr
    assert res["strongest_peer"] == "hf+peft", res.get("strongest_peer")
    peers = res["peers"]
    assert [p["rows_packed"] for p in peers] == [packed, packed], peers
    flops = res["matrix_flops"]
    assert len(flops["per_step"]) >= 8 and flops["gemm_flops_per_s"] > 0, flops
    parts = peers[0]["flops_parts_step1"]
    ckpt = name.startswith("long")
    assert parts["recompute"] == (parts["base_fwd"] + parts["lora_fwd"] + parts["attention_fwd"] if ckpt else 0), parts
    assert parts["total"] == sum(v for k, v in parts.items() if k != "total"), parts
    if not packed:  # every row one sample of the same length: the same FLOPs every step
        assert len(set(flops["per_step"])) == 1, flops["per_step"]
    assert peers[0]["setup"]["activation_checkpointing"] == ckpt, peers[0]["setup"]
    liger = rows["hf+peft+liger"]
    if have_liger:  # on a CPU it loads and patches, then says its Triton kernels need a GPU
        assert "CUDA" in liger["skipped"] and liger["attention"] == attn, liger
        mods = peers[1]["setup"]["liger_modules"]
        assert mods["norm"] == "LigerRMSNorm" and mods["causal_lm_forward"].startswith("liger_kernel."), mods
        assert mods["experts" if name.endswith("moe") else "mlp"] in ("LigerExperts", "LigerSwiGLUMLP"), mods
    else:
        assert "not importable" in liger["skipped"], liger
print(f"train_step run.sh on the CPU: sft-moe and long-dense-32k as expected (liger {'patched' if have_liger else 'absent'})")
