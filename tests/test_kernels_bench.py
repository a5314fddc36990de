"""benchmarks/bench_kernels.py's non-GPU logic, on CPU: case grid, byte counts, table,
random cases, the gather+SDPA baseline and the arguments it hands vLLM's kernel.

The timings themselves need a GPU (benchmarks/gpu_check.sh); these tests keep the
script importable and its baselines honest where no GPU is lent.
"""

import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    # Before the first Triton import (tests/conftest.py does the same for whole runs).
    os.environ.setdefault("TRITON_INTERPRET", "1")

BENCH_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_kernels.py"
_spec = importlib.util.spec_from_file_location("bench_kernels", BENCH_PATH)
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_kernels"] = bench  # dataclasses look their module up there
_spec.loader.exec_module(bench)
kernels = bench.kernels

SMALL = bench.Shape(q_heads=4, kv_heads=2, head_size=64, block_size=16, dtype=torch.float32)


def test_case_grid_spans_the_issue_ranges() -> None:
    full = bench.case_grid(quick=False)
    batches, ctxs, qs = (sorted({c[i] for c in full}) for i in range(3))
    assert (batches[0], batches[-1]) == (1, 64)
    assert (ctxs[0], ctxs[-1]) == (512, 32768)
    assert (qs[0], qs[-1]) == (1, 128)
    quick = bench.case_grid(quick=True)
    assert set(quick) < set(bench.case_grid(quick=False)) or len(quick) < len(full)
    assert {c[1] for c in quick} == {512, 32768} and len(quick) <= 12


def test_byte_and_flop_counts() -> None:
    shape = bench.Shape(q_heads=32, kv_heads=8, head_size=128, dtype=torch.bfloat16)
    # K and V: 2 * 4 seqs * (1000 + 24) tokens * 8 heads * 128 * 2 bytes
    kv = 2 * 4 * 1024 * 8 * 128 * 2
    qo = 2 * 4 * 24 * 32 * 128 * 2
    assert bench.attention_bytes(4, 1000, 24, shape) == kv + qo
    assert bench.attention_flops(4, 1000, 24, shape) == 4 * 4 * 24 * 1024 * 32 * 128
    assert bench.compaction_bytes(10, 32, shape) == 2 * 2 * 10 * 32 * 8 * 128 * 2
    assert bench.gbps(2_000_000, 1.0) == pytest.approx(2.0)  # 2 MB in 1 ms = 2 GB/s
    assert bench.gbps(1, None) is None


def test_table_rows_line_up_and_show_skipped_baselines() -> None:
    row = bench.attention_row(8, 2048, 16, bench.Shape(), 0.5, 0.25, None, 3e-3)
    line, header = bench.format_row(row), bench.format_header()
    assert len(line) == len(header)
    cells = line.split()
    assert cells[:3] == ["8", "2048", "16"] and cells[-3] == "-" and cells[-2] == "-"
    assert float(cells[4]) == pytest.approx(row["tree_GBs"], rel=1e-2, abs=1)


def test_random_case_has_scattered_blocks_and_valid_trees() -> None:
    c = bench.make_case(3, 40, 5, SMALL, device=DEVICE)
    table = c["block_table"].cpu()
    assert table.shape == (3, 3)  # ceil(45 / 16)
    assert sorted(table.flatten().tolist()) == list(range(9))
    assert table.flatten().tolist() != list(range(9))  # not the identity layout
    assert c["query"].shape == (15, 4, 64) and c["seq_lens"].tolist() == [45] * 3
    for parents in c["parents"]:
        kernels.tree_mask_dense(parents)  # raises on an invalid tree
    assert c["mask_bits"].shape == (15, 1)


def test_sdpa_baseline_and_tree_kernel_match_the_reference() -> None:
    """The benchmark's own correctness path, on CPU through the interpreter."""
    c = bench.make_case(2, 37, 6, SMALL, device=DEVICE)
    scale = SMALL.head_size**-0.5
    out = torch.full_like(c["query"], float("nan"))
    bench.run_tree(c, out, scale)
    assert bench.reference_error(c, out, scale) < bench.TOL[torch.float32]
    sdpa = torch.full_like(c["query"], float("nan"))
    bench.make_sdpa_runner(c, scale)(sdpa)
    assert bench.reference_error(c, sdpa, scale) < 1e-5
    assert bench.sdpa_gather_bytes(c) == 2 * 2 * 43 * 4 * 64 * 4


def test_reference_error_flags_unwritten_rows() -> None:
    c = bench.make_case(1, 20, 3, SMALL, device=DEVICE)
    out = torch.full_like(c["query"], float("nan"))
    err = bench.reference_error(c, out, 0.125)
    assert not err < 1.0  # NaN never passes


def test_vllm_unified_attention_path_and_arguments_exist() -> None:
    pytest.importorskip("vllm", reason="vLLM's unified_attention baseline needs vLLM")
    module = importlib.import_module(bench.UNIFIED_ATTENTION)
    c = bench.make_case(2, 30, 4, SMALL, device=DEVICE)
    kwargs = bench.unified_attention_kwargs(c, 0.125, torch.empty_like(c["query"]))
    inspect.signature(module.unified_attention).bind(**kwargs)  # TypeError if stale
    assert kwargs["softmax_segm_output"].shape[0] >= kwargs["seq_threshold_3D"]


def test_vllm_baseline_is_optional() -> None:
    """Without vLLM (the lent GPU machine) the vLLM column is skipped, not an error."""
    c = bench.make_case(1, 20, 3, SMALL, device=DEVICE)
    try:
        importlib.import_module(bench.UNIFIED_ATTENTION)
        has_vllm = True
    except ImportError:
        has_vllm = False
    runner = bench.make_vllm_runner(c, 0.125)
    assert (runner is not None) == has_vllm
