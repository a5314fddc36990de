"""Timings for the GPU check (benchmarks/gpu_check.sh): numbers, not assertions.

1. Tree attention: the Triton kernel over the paged cache vs PyTorch SDPA with an
   explicit boolean tree mask, (a) including the gather of each request's K/V out of
   the paged cache (what a SDPA-based backend would have to do) and (b) on K/V already
   contiguous (SDPA alone, a lower bound). Shapes of an 8B-class model (32 query / 8
   KV heads, head 128, bf16), PTD-sized query blocks (16, 64 nodes).
2. Argmax over tree rows' logits, vocabulary 152k (Qwen2-class): on the device
   (``logits.argmax(-1)`` and the indices to the host) vs on the host (the logits
   copied to the host, then ``numpy.argmax``), 16..64 rows, bf16 and fp32 logits.

Prints a table and writes ``--csv``. Each row also records whether the two methods
agreed (``match``: tree kernel within the test bound of SDPA; identical argmax).
Without CUDA it runs only with ``--allow-cpu`` (Triton's interpreter, tiny shapes, a
dry run of the code path: the times mean nothing). No vLLM needed.

Usage: python benchmarks/gpu_timings.py [--csv timings.csv] [--allow-cpu]
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported


def load_bench():
    """benchmarks/bench_kernels.py (case generation, SDPA runner, tree runner)."""
    spec = importlib.util.spec_from_file_location("bench_kernels", HERE / "bench_kernels.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_kernels"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def time_ms(fn, reps: int, warmup: int) -> float:
    """Median wall time of ``fn()`` in ms, synchronizing around each call (so a
    host-side copy and a device kernel are measured the same way)."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def attention_timings(bench, tiny: bool, reps: int, warmup: int) -> list[dict]:
    if tiny:
        shape = bench.Shape(q_heads=4, kv_heads=2, head_size=64, dtype=torch.float32)
        cases = [(1, 40, 16), (2, 24, 20)]
    else:
        shape = bench.Shape(q_heads=32, kv_heads=8, head_size=128, dtype=torch.bfloat16)
        cases = [(b, ctx, q) for b in (1, 16) for ctx in (1024, 8192) for q in (16, 64)]
    device = "cuda" if CUDA else "cpu"
    scale = shape.head_size**-0.5
    rows = []
    for batch, ctx, q_len in cases:
        c = bench.make_case(batch, ctx, q_len, shape, device=device)
        out = torch.empty_like(c["query"])
        tree_ms = time_ms(lambda c=c, out=out: bench.run_tree(c, out, scale), reps, warmup)
        sdpa_run = bench.make_sdpa_runner(c, scale)
        sdpa_out = torch.empty_like(c["query"])
        sdpa_ms = time_ms(lambda r=sdpa_run, o=sdpa_out: r(o), reps, warmup)
        contiguous = contiguous_sdpa(c, scale)
        pure_ms = time_ms(contiguous, reps, warmup)
        err = ((out.double() - sdpa_out.double()).norm() / sdpa_out.double().norm()).item()
        rows.append(
            {
                "kind": "attention",
                "case": f"batch={batch} ctx={ctx} q={q_len} {str(shape.dtype)[6:]} "
                f"h{shape.q_heads}/{shape.kv_heads}x{shape.head_size}",
                "ours": "tree_kernel",
                "ours_ms": tree_ms,
                "theirs": "sdpa+gather",
                "theirs_ms": sdpa_ms,
                "extra": "sdpa_contiguous",
                "extra_ms": pure_ms,
                "match": bool(err < bench.TOL[shape.dtype]),
                "note": f"rel diff {err:.1e}",
            }
        )
        del c, out, sdpa_out
        if CUDA:
            torch.cuda.empty_cache()
    return rows


def contiguous_sdpa(c: dict, scale: float):
    """SDPA with the explicit mask on K/V gathered once beforehand (GQA repeated)."""
    batch, q_len, ctx = c["batch"], c["q_len"], c["ctx"]
    device = c["query"].device
    seq, bs = ctx + q_len, c["key_cache"].shape[1]
    group = c["query"].shape[1] // c["key_cache"].shape[2]
    pos = torch.arange(seq, device=device)
    blocks = c["block_table"].long()[:, pos // bs]
    offs = (pos % bs).expand(batch, seq)
    k = c["key_cache"][blocks, offs].repeat_interleave(group, dim=2).transpose(1, 2)
    v = c["value_cache"][blocks, offs].repeat_interleave(group, dim=2).transpose(1, 2)
    q = c["query"].view(batch, q_len, *c["query"].shape[1:]).transpose(1, 2)
    mask = torch.ones(batch, 1, q_len, seq, dtype=torch.bool, device=device)
    for r, parents in enumerate(c["parents"]):
        mask[r, 0, :, ctx:] = bench_kernels_mask(parents).to(device)

    def run() -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale
        )

    return run


def bench_kernels_mask(parents):
    return sys.modules["bench_kernels"].kernels.tree_mask_dense(parents)


def argmax_timings(tiny: bool, reps: int, warmup: int) -> list[dict]:
    vocab = 1000 if tiny else 152064
    device = "cuda" if CUDA else "cpu"
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for n in (16, 32, 64):
            gen = torch.Generator(device=device).manual_seed(n)
            logits = torch.randn(n, vocab, device=device, generator=gen).to(dtype)
            # Device: argmax there, then the n indices to the host (one small copy).
            dev_ms = time_ms(lambda lg=logits: lg.argmax(-1).cpu().numpy(), reps, warmup)
            # Host: the whole logits block to the host, then numpy (fp32 upcast first,
            # numpy has no bf16).
            host_ms = time_ms(lambda lg=logits: lg.float().cpu().numpy().argmax(-1), reps, warmup)
            same = bool(
                (logits.argmax(-1).cpu().numpy() == logits.float().cpu().numpy().argmax(-1)).all()
            )
            mb = n * vocab * logits.element_size() / 1e6
            rows.append(
                {
                    "kind": "argmax",
                    "case": f"rows={n} vocab={vocab} {str(dtype)[6:]} ({mb:.1f} MB)",
                    "ours": "device_argmax",
                    "ours_ms": dev_ms,
                    "theirs": "host_copy_numpy",
                    "theirs_ms": host_ms,
                    "extra": "",
                    "extra_ms": None,
                    "match": same,
                    "note": "",
                }
            )
    return rows


FIELDS = [
    "kind",
    "case",
    "ours",
    "ours_ms",
    "theirs",
    "theirs_ms",
    "extra",
    "extra_ms",
    "match",
    "note",
]


def fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--csv", default=None)
    parser.add_argument(
        "--allow-cpu",
        action="store_true",
        help="without CUDA, dry-run through the interpreter (tiny shapes)",
    )
    parser.add_argument("--reps", type=int, default=None)
    args = parser.parse_args()
    if not CUDA and not args.allow_cpu:
        print("gpu_timings.py: no CUDA device (pass --allow-cpu for a dry run)")
        return 2
    tiny = not CUDA
    reps = args.reps or (3 if tiny else 50)
    warmup = 1 if tiny else 10
    bench = load_bench()
    if CUDA:
        print(torch.cuda.get_device_name(), "| torch", torch.__version__)
    else:
        print("CPU dry run (Triton interpreter, tiny shapes): times are meaningless")
    rows = attention_timings(bench, tiny, reps, warmup) + argmax_timings(tiny, reps, warmup)
    width = max(len(r["case"]) for r in rows)
    print(
        f"{'kind':<9} {'case':<{width}} | {'ours':<15} {'ms':>8} | {'baseline':<15} "
        f"{'ms':>8} | {'extra':<15} {'ms':>8} | {'speedup':>7} match"
    )
    for r in rows:
        speedup = r["theirs_ms"] / r["ours_ms"] if r["ours_ms"] else float("nan")
        print(
            f"{r['kind']:<9} {r['case']:<{width}} | {r['ours']:<15} {fmt_ms(r['ours_ms']):>8} | "
            f"{r['theirs']:<15} {fmt_ms(r['theirs_ms']):>8} | {r['extra']:<15} "
            f"{fmt_ms(r['extra_ms']):>8} | {speedup:>6.1f}x {r['match']} {r['note']}"
        )
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)
    if not all(r["match"] for r in rows):
        print("gpu_timings.py: some methods disagreed (match=False); see the note column")
    return 0


if __name__ == "__main__":
    sys.exit(main())
