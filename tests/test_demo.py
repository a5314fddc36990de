"""`vllm-ptd demo`, the Quick start: its table, its exactness line, and vLLM's log lines kept
out of the user's terminal. The end-to-end run is an engine test (real engines, tiny settings,
in the dtype the demo picks for this CPU); the helpers are checked without an engine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.ptd_bench import demo


def test_the_mixed_workload_takes_the_sets_in_turn():
    work = demo.mixed_workload(["mt_bench", "gsm8k"], 2)
    assert [len(c) for c in work.conversations] == [2, 1, 2, 1]  # MT-Bench has two turns
    assert work.num_requests == 6
    mt = demo.load_workload("mt_bench", 2).conversations
    assert work.conversations[0] == mt[0] and work.conversations[2] == mt[1]


def test_the_exactness_conversations_can_follow_the_speed_ones():
    speed = demo.mixed_workload(["gsm8k", "mbpp"], 2)
    exact = demo.mixed_workload(["gsm8k", "mbpp"], 1, "exactness", skip=2)
    assert exact.dataset == "exactness" and len(exact.conversations) == 2
    assert exact.conversations[0] == demo.load_workload("gsm8k", 3).conversations[2]
    assert not set(map(tuple, exact.conversations)) & set(map(tuple, speed.conversations))


@pytest.mark.parametrize("flags, want", [
    ({"avx2", "fma"}, "float32"),                          # AVX2 only: bf16 GEMMs fall back
    ({"avx2", "avx512f", "avx512_bf16"}, "bfloat16"),
    ({"avx2", "avx512f"}, "bfloat16"),                     # oneDNN's bf16 runs on AVX-512
    (set(), "bfloat16"),                                   # nothing known (not x86 Linux)
])
def test_auto_dtype_is_float32_only_where_bf16_gemms_fall_back(monkeypatch, flags, want):
    from vllm_ptd import cpu_features

    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset(flags))
    assert demo.speed_dtype("auto") == want
    assert demo.speed_dtype("float16") == "float16"


def test_speed_table_has_a_line_for_suffix_when_it_could_not_run():
    rows = [{"method": "plain", "kind": "plain", "tokens_per_s": 50.0, "speedup": 1.0, "DE": 1.0},
            {"method": "ngram k=4", "kind": "ngram", "tokens_per_s": 60.0, "speedup": 1.2,
             "DE": 1.4},
            {"method": "ptd", "kind": "ptd", "tokens_per_s": 75.0, "speedup": 1.5, "DE": None}]
    lines = demo.speed_table(rows, suffix_ran=False)
    assert [line.split()[0] for line in lines] == ["method", "plain", "ngram", "suffix", "ptd"]
    assert lines[3].startswith("suffix") and "not installed" in lines[3]
    assert lines[4].split()[1:] == ["75.0", "1.50x", "-"]
    assert "suffix" not in "".join(demo.speed_table(rows, suffix_ran=True))


def test_logs_to_sends_this_process_and_its_children_to_the_file(tmp_path, capfd):
    log = tmp_path / "log.txt"
    with demo.logs_to(log) as (out, err):
        os.write(1, b"from python\n")  # vLLM's logger writes to file descriptor 1
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('from a child\\n')"],
                       check=True)
        print("for the user", file=out)
        print("progress", file=err)
    print("after")
    captured = capfd.readouterr()
    assert captured.out == "for the user\nafter\n"
    assert captured.err == "progress\n"
    assert log.read_text().splitlines() == ["from python", "from a child"]


@pytest.mark.engine
def test_demo_prints_the_speed_table_and_the_exactness_line_and_hides_vllm_logs(tmp_path):
    log = tmp_path / "vllm.log"
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_ptd.cli", "demo", "--datasets", "mt_bench", "--prompts", "1",
         "--max-tokens", "8", "--exact-prompts", "1", "--log-file", str(log)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = proc.stdout
    rows = [line.split()[0] for line in out.splitlines()
            if line.split()[:1] in (["plain"], ["ngram"], ["suffix"], ["ptd"])]
    assert rows == ["plain", "ngram", "suffix", "ptd"], out
    assert "method        tokens/s  x plain  tokens/step" in out
    # The default dtype for this CPU; in float32 one set of engines also checks exactness.
    dtype = demo.speed_dtype("auto")
    assert f"Speed: {dtype}, greedy, batch 1" in out and "2 prompts (MT-Bench 1x2 turns)" in out
    started = log.read_text().count("starting the engine")
    assert started == (3 if dtype == "float32" else 5) + demo.suffix_installed(), started
    assert "identical to plain decoding's on 2/2 prompts" in out
    assert f"{os.cpu_count()} CPU cores" in out and "noisy" in out
    # vLLM's log lines went to the file, not to the terminal
    assert "INFO" not in out + proc.stderr and "EngineCore" in log.read_text()
    assert str(log) in out
