#!/usr/bin/env python3
"""check_result_citations.py on small made-up trees: what it must pass and what it must catch.
usage: check_result_citations_test.py PATH_TO_CHECKER"""
import json
import os
import subprocess
import sys
import tempfile

checker = sys.argv[1]
RESULT = {"device": "NVIDIA H200", "date": "2026-11-24", "command": "bash bench/x.sh",
          "ms_per_step": 375.51, "tokens_per_s": 20759, "gpu_idle_share": 0.0167, "fwd_ms": 0.015648,
          "a_ms": 39.42, "b_ms": 31.63}


def check(doc, results=None, expect_ok=True, expect=None):
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "docs"))
        os.makedirs(os.path.join(root, "bench", "results"))
        open(os.path.join(root, "README.md"), "w").write("# x\n")
        open(os.path.join(root, "docs", "page.md"), "w").write(doc)
        for name, data in (results if results is not None else {"r.json": RESULT}).items():
            open(os.path.join(root, "bench", "results", name), "w").write(json.dumps(data))
        p = subprocess.run([sys.executable, checker, root], capture_output=True, text=True)
        out = p.stdout + p.stderr
        assert (p.returncode == 0) == expect_ok, (doc, out)
        if expect:
            assert expect in out, (expect, out)


cite = "`bench/results/r.json`"
# Figures that are in the file: rounded, with a unit, as a percentage of a stored fraction, in another time unit,
# as a ratio of two of its numbers; goals and bounds are not figures; integers without a unit are not either.
check(f"One H200 ({cite}): **375.5 ms/step**, 20,759 tokens/s, GPU idle 1.7 %, fwd 15.6 µs, 1.25× slower "
      "(goal ≤ 300 ms), 57 steps.\n")
# A table a paragraph introduces is checked against the paragraph's citation.
check(f"Measured ({cite}):\n\n| a | b |\n|---|---|\n| 375.5 ms | 20,759 tokens/s |\n")
check(f"Measured ({cite}):\n\n| a | b |\n|---|---|\n| 448 ms | 20,759 tokens/s |\n", expect_ok=False,
      expect="docs/page.md:1: 448 ms is in none of bench/results/r.json")
# A stale figure in the paragraph.
check(f"One H200 ({cite}): 448 ms/step.\n", expect_ok=False, expect="448 ms")
# A table row citing its own file.
check(f"| x | 0.163 ms | {cite} |\n", expect_ok=False, expect="0.163 ms")
# A list item is a paragraph of its own: the figure of another item is not checked against this one's citation.
check(f"- one: 448 ms, from a run that was not committed\n- two: 375.5 ms ({cite})\n")
# A cited file that does not exist.
check("See `bench/results/missing.json`: 1.5 ms.\n", expect_ok=False, expect="cites bench/results/missing.json, which does not exist")
# A result file that does not say where and when.
check("No citation here.\n", results={"r.json": {"ms": 1.0}}, expect_ok=False, expect="bench/results/r.json: no \"device\" inside")
check("No citation here.\n", results={"r.json": [{"device": "x", "date": "y"}, {"device": "x"}]}, expect_ok=False,
      expect="no \"date\" inside")
print("check_result_citations.py: passes what holds, catches what does not")
