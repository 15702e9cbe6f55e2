"""bench/vlm_sft/run.sh (the VLM SFT step benchmark of docs/performance.md) run on the CPU at toy sizes (TINY=1:
the tiny-qwen3-vl preset's shape, small JPEGs, short conversations), so the harness is proven before GPU time is
spent on it. Checks that the corpus is what make_corpus.py says (1-4 images per conversation, sides in the asked
range, user/assistant turns), that both systems trained the same batches (the same real tokens and the same
assistant-only label tokens every step: the peer's processor + packing mirror axengine's chat_template rows), start
from the same loss (LoRA B = 0: the base model's), and saw every image of the corpus once per epoch, that the
timing, images/s and MFU fields are filled, and that the result files say where, when and how they were made.
usage: check_vlm_sft_bench.py AXENGINE_BIN SCRATCH_DIR"""
import json
import os
import shutil
import subprocess
import sys

from PIL import Image

ax, scratch = sys.argv[1], sys.argv[2]
shutil.rmtree(scratch, ignore_errors=True)
os.makedirs(scratch)
here = os.path.dirname(os.path.abspath(__file__))
script = os.path.join(here, "..", "..", "bench", "vlm_sft", "run.sh")
work, out = os.path.join(scratch, "work"), os.path.join(scratch, "out")
env = dict(os.environ, TINY="1", PYTHON=sys.executable, AXENGINE_BIN=ax, OUT=out, AX_BENCH_WORK=work)
subprocess.run(["bash", script], env=env, check=True)

# The corpus: 10 conversations of 1-4 images (TINY: sides 64-160 px), alternating user/assistant turns.
corpus = os.path.join(work, "corpus")
rows = [json.loads(line) for line in open(os.path.join(corpus, "train.jsonl"))]
assert len(rows) == 10, len(rows)
n_images = 0
for r in rows:
    roles = [m["role"] for m in r["messages"] if m["role"] != "system"]
    assert roles == ["user", "assistant"] * (len(roles) // 2) and roles, roles
    parts = [p for m in r["messages"] if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image"]
    assert 1 <= len(parts) <= 4, r
    for p in parts:
        w, h = Image.open(os.path.join(corpus, p["image"])).size
        assert 64 <= w <= 160 and 64 <= h <= 160, (p, w, h)
    n_images += len(parts)

res = json.load(open(os.path.join(out, "vlm-sft-step.json")))
md = open(os.path.join(out, "vlm-sft-step.md")).read()
assert res["device"] == "cpu" and res["date"] and res["command"] == "TINY=1 bash bench/vlm_sft/run.sh", res
assert res["command"] in md and res["date"] in md and "images/s" in md, md
assert res["bench"].startswith("vlm_sft step: Qwen3-VL, decoder 2 layers of hidden 64"), res["bench"]
sys_rows = {r["system"]: r for r in res["rows"]}
assert set(sys_rows) == {"axengine", "hf+peft"}, sorted(sys_rows)
axr, hf = sys_rows["axengine"], sys_rows["hf+peft"]
for r in (axr, hf):
    assert r["ms_per_step"] > 0 and r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1, r
    assert r["images_per_s"] > 0 and 1 <= r["images_per_step"], r
# The same steps timed on both sides (2 of warm-up, 3 timed), so the same images per step.
assert axr["timed_steps"] == [2, 5] and (hf["warmup_steps"], hf["steps_timed"]) == (2, 3), (axr, hf)
assert axr["images_per_step"] == hf["images_per_step"], (axr, hf)
assert res["same_tokens_per_step"] == {"hf+peft": True}, res["same_tokens_per_step"]
assert res["same_label_tokens_per_step"] == {"hf+peft": True}, res["same_label_tokens_per_step"]
assert abs(axr["first_loss"] - hf["first_loss"]) < 2e-3 * abs(hf["first_loss"]), (axr, hf)
assert axr["ratio_vs_hf_eager"] == round(axr["ms_per_step"] / hf["ms_per_step"], 3), axr
assert res["goals"]["ratio_vs_hf_eager_max"] == 0.5, res["goals"]
# Every row once per epoch: the first epoch's steps hold every image of the corpus exactly once.
peer = json.load(open(os.path.join(work, "logs", "peer.json")))
wl = res["workload"]
assert wl["conversations"] == 10 and wl["corpus"]["images"] == n_images, wl
assert sum(peer["step_images"][:wl["packed_rows"]]) == n_images, (peer["step_images"], wl)
assert len(res["matrix_flops"]["per_step"]) >= 5 and res["matrix_flops"]["gemm_flops_per_s"] > 0, res["matrix_flops"]
assert os.path.getsize(os.path.join(out, "vlm-sft-step-logs.tgz")) > 0
print(f"vlm_sft run.sh on the CPU: {n_images} images in 10 conversations, same batches and labels on both sides, "
      f"first loss {axr['first_loss']:.4f} / {hf['first_loss']:.4f}")
