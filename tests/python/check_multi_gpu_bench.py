"""bench/dist/multi_gpu.sh (the multi-GPU job of docs/distributed.md) run on the CPU over Gloo (DEVICE=cpu: the
tiny Qwen3-MoE, 2 ranks), so the script and its summary keep working between the sessions that have a multi-GPU
machine: every run finishes, and the summary says what the C++ tests say of the same runs (data parallel and
expert parallel train what one process with grad_accum 2 trains, shard_base trains what plain data parallel
trains bit for bit, expert parallel keeps fewer base bytes on rank 0).
usage: check_multi_gpu_bench.py AXENGINE_BIN SCRATCH_DIR"""
import json
import os
import shutil
import subprocess
import sys

ax, scratch = sys.argv[1], sys.argv[2]
shutil.rmtree(scratch, ignore_errors=True)
os.makedirs(scratch)
script = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "dist", "multi_gpu.sh")
env = dict(os.environ, DEVICE="cpu", STEPS="6", PYTHON=sys.executable, AXENGINE_BIN=ax, OUT=scratch,
           AX_BENCH_WORK=os.path.join(scratch, "work"))
subprocess.run(["bash", script], env=env, check=True)
res = json.load(open(os.path.join(scratch, "multi-gpu.json")))
runs = res["runs"]
assert set(runs) == {"one", "dp", "ep", "shard"}, sorted(runs)
for r in ("dp", "ep", "shard"):
    assert runs[r]["max_rel_loss_diff_vs_one"] < 1e-5, (r, runs[r])
    assert runs[r]["max_rel_adapter_diff_vs_one"] < 1e-3, (r, runs[r])
    assert runs[r]["tokens_per_step"] == runs["one"]["tokens_per_step"], (r, runs[r])
assert runs["shard"]["max_abs_loss_diff_vs_dp"] == 0.0 and runs["shard"]["adapter_bitwise_equal_to_dp"], runs["shard"]
assert runs["ep"]["base_resident_bytes_rank0"] < runs["one"]["base_resident_bytes_rank0"], runs["ep"]
assert runs["shard"]["base_resident_bytes_rank0"] < runs["one"]["base_resident_bytes_rank0"], runs["shard"]
print("multi_gpu.sh on the CPU: 4 runs, summary as expected")
