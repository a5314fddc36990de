"""`vllm-ptd bench --smoke` end to end in a subprocess, as CI runs it: two engines (plain and
PTD), two conversations per set, 16 tokens. Keeps the benchmark from rotting: its rows, its
zero-mismatch promise, the markdown and the plot must all come out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_benchmark_writes_rows_table_and_plot_with_no_mismatch(tmp_path):
    env = {**os.environ, "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_ptd.cli", "bench", "--smoke", "--no-progress",
         "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]

    result = json.loads((tmp_path / "results.json").read_text())
    rows = result["rows"]
    datasets = {"mt_bench", "gsm8k", "humaneval", "mbpp"}
    assert {(r["method"], r["dataset"]) for r in rows} == {
        (m, d) for m in ("plain", "ptd") for d in datasets}
    ptd = [r for r in rows if r["kind"] == "ptd"]
    assert all(r["mismatches"] == 0 for r in ptd), [r["mismatched"] for r in ptd]
    # MT-Bench answers both turns; the other sets one
    assert {r["dataset"]: r["requests"] for r in ptd} == {
        "mt_bench": 4, "gsm8k": 2, "humaneval": 2, "mbpp": 2}
    assert all(r["tokens"] > 0 and r["speedup"] > 0 and r["DE"] >= 1.0 for r in ptd)
    # PTD drafted: chains carry C rows only, trees C and T rows (auto drafts either)
    assert all(r["steps"] > 0 and r["C_nodes_per_step"] + r["T_nodes_per_step"] > 0
               for r in ptd)

    md = (tmp_path / "results.md").read_text()
    assert "| Method | MT-Bench Speedup | MT-Bench DE |" in md
    assert "Greedy mismatches against plain decoding: **0**." in md
    png = tmp_path / "speedup_offline_c1.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
