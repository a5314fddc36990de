"""GPU benchmark of the PTD kernels (the fourth part of each kernel's quartet).

Tree attention vs (a) vLLM's Triton ``unified_attention`` on the same number of query
tokens with a causal mask (what a linear draft of equal size would cost; only when vLLM
imports), and (b) gather-to-contiguous + PyTorch SDPA with a dense boolean tree mask
(always). KV compaction: the
Triton kernel (all layers in one launch) vs the PyTorch path.

Every tree-attention case is first checked against the float64 reference
(``tree_attention_ref``, on the first and last request) with the test suite's
per-dtype bounds; a failing case is reported and makes the exit status 1.

Achieved bandwidth counts the fewest bytes the work must move (METHOD.md's floor):
every K/V row of every sequence read once, queries read once, outputs written once.
The tree kernel re-reads K/V once per query tile, so low GB/s at long query blocks
means re-reads, not a slow memory system.

The tree kernel runs as the engine calls it: where a batch is too small to fill the GPU,
long prefixes are cut into split-KV slices (``splits`` column) and the same kernel
without slices is timed beside it (``unsplit_ms``). ``--sweep-splits`` times forced
slice counts against the automatic choice.

Usage: python benchmarks/bench_kernels.py [--quick] [--dtype bf16] [--csv out.csv]
       python benchmarks/bench_kernels.py --sweep-splits
Needs a CUDA GPU for the timings; the case generation, byte counts and table code
import and run on CPU (tests/test_kernels_bench.py).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import triton

try:
    from vllm_ptd import kernels
except ImportError:  # from a checkout: kernels/ is the package source
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import kernels  # type: ignore[no-redef]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Same bounds as tests/test_kernels_tree_attention.py (METHOD.md).
TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}
UNIFIED_ATTENTION = "vllm.v1.attention.ops.triton_unified_attention"


@dataclass(frozen=True)
class Shape:
    """Model-side shape of one benchmark run."""

    q_heads: int = 32
    kv_heads: int = 8
    head_size: int = 128
    block_size: int = 16
    dtype: torch.dtype = torch.bfloat16


def case_grid(quick: bool) -> list[tuple[int, int, int]]:
    """(batch, context, query block) cases: context 512..32k, query 1..128, batch 1..64."""
    if quick:
        batches, ctxs, qs = [1, 16], [512, 32768], [1, 16, 128]
    else:
        batches, ctxs, qs = [1, 8, 64], [512, 2048, 8192, 32768], [1, 16, 64, 128]
    return list(itertools.product(batches, ctxs, qs))


def attention_bytes(batch: int, ctx: int, q_len: int, shape: Shape) -> int:
    """Fewest bytes one attention call moves: K and V of every sequence, Q in, O out."""
    elt = torch.tensor([], dtype=shape.dtype).element_size()
    kv = 2 * batch * (ctx + q_len) * shape.kv_heads * shape.head_size
    qo = 2 * batch * q_len * shape.q_heads * shape.head_size
    return (kv + qo) * elt


def attention_flops(batch: int, ctx: int, q_len: int, shape: Shape) -> int:
    """QK^T and PV over every visible-or-not key (what the kernels compute)."""
    return 4 * batch * q_len * (ctx + q_len) * shape.q_heads * shape.head_size


def compaction_bytes(num_pairs: int, num_layers: int, shape: Shape) -> int:
    """Each pair reads and writes one K row and one V row per layer."""
    elt = torch.tensor([], dtype=shape.dtype).element_size()
    return 2 * 2 * num_pairs * num_layers * shape.kv_heads * shape.head_size * elt


def gbps(num_bytes: int, ms: float | None) -> float | None:
    return None if ms is None else num_bytes / ms / 1e6


def random_parents(n: int, gen: torch.Generator) -> list[int]:
    """Random tree in topological order (token 0 is x), as PTD's [x; C; T] block."""
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]


def make_case(batch: int, ctx: int, q_len: int, shape: Shape, device: str = "cuda") -> dict:
    """Random paged batch: shuffled (non-contiguous) blocks, random trees and data."""
    gen = torch.Generator().manual_seed(batch * 7919 + ctx * 31 + q_len)
    bs, seq = shape.block_size, ctx + q_len
    blocks_per_req = triton.cdiv(seq, bs)
    num_blocks = batch * blocks_per_req
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    block_table = perm.view(batch, blocks_per_req).to(device)
    cache_shape = (num_blocks, bs, shape.kv_heads, shape.head_size)
    dev_gen = torch.Generator(device=device).manual_seed(int(gen.initial_seed()))

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(size, generator=dev_gen, device=device).to(shape.dtype)

    parents = [random_parents(q_len, gen) for _ in range(batch)]
    mask_bits, mask_words = kernels.pack_tree_masks(parents, device=device)
    return {
        "query": randn(batch * q_len, shape.q_heads, shape.head_size),
        "key_cache": randn(*cache_shape),
        "value_cache": randn(*cache_shape),
        "block_table": block_table,
        "seq_lens": torch.full((batch,), seq, dtype=torch.int32, device=device),
        "query_start_loc": torch.arange(
            0, batch * q_len + 1, q_len, dtype=torch.int32, device=device
        ),
        "mask_bits": mask_bits,
        "mask_words": mask_words,
        "parents": parents,
        "batch": batch,
        "ctx": ctx,
        "q_len": q_len,
    }


def run_tree(c: dict, out: torch.Tensor, scale: float, num_kv_splits: int | None = None) -> None:
    """The kernel as the engine calls it (host max_seq_len: split-KV where it pays);
    ``num_kv_splits=1`` for the kernel without split-KV."""
    kernels.tree_attention(
        c["query"],
        c["key_cache"],
        c["value_cache"],
        c["block_table"],
        c["seq_lens"],
        c["query_start_loc"],
        c["mask_bits"],
        c["mask_words"],
        scale,
        out,
        max_query_len=c["q_len"],
        max_seq_len=c["ctx"] + c["q_len"],
        num_kv_splits=num_kv_splits,
    )


def kv_splits(c: dict, shape: Shape) -> int:
    """How many prefix slices the kernel picks for this case on this GPU."""
    ta = sys.modules[kernels.__name__ + ".tree_attention"]
    return ta.auto_kv_splits(
        c["batch"], c["q_len"], shape.q_heads, shape.kv_heads, c["ctx"] + c["q_len"],
        c["query"].device,
    )


def reference_error(c: dict, out: torch.Tensor, scale: float) -> float:
    """Relative error of ``out`` vs the float64 reference on the first and last request."""
    errs = []
    for r in sorted({0, c["batch"] - 1}):
        rows = slice(r * c["q_len"], (r + 1) * c["q_len"])
        ref = kernels.tree_attention_ref(
            c["query"][rows],
            c["key_cache"],
            c["value_cache"],
            c["block_table"][r : r + 1],
            c["seq_lens"][r : r + 1],
            torch.tensor([0, c["q_len"]], dtype=torch.int32),
            [c["parents"][r]],
            scale,
        )
        got = out[rows].double()
        if got.isnan().any():
            return float("nan")
        errs.append(((got - ref).norm() / ref.norm()).item())
    return max(errs)


def unified_attention_kwargs(c: dict, scale: float, out: torch.Tensor) -> dict:
    """Arguments for vLLM's ``unified_attention``: same tokens, causal, vLLM's own
    3D-path scratch sizing (``TritonAttentionMetadataBuilder``)."""
    q_heads, head = c["query"].shape[1:]
    kv_heads = c["key_cache"].shape[2]
    device = c["query"].device
    segments = 16
    seq_threshold_3d = 128 // kv_heads
    rows = max(seq_threshold_3d, c["query"].shape[0])
    f32 = {"dtype": torch.float32, "device": device}
    segm_out = torch.empty(rows, q_heads, segments, triton.next_power_of_2(head), **f32)
    segm_max = torch.empty(rows, q_heads, segments, **f32)
    descale = torch.ones(c["batch"], kv_heads, **f32)
    return {
        "q": c["query"],
        "k": c["key_cache"],
        "v": c["value_cache"],
        "out": out,
        "cu_seqlens_q": c["query_start_loc"],
        "max_seqlen_q": c["q_len"],
        "seqused_k": c["seq_lens"],
        "max_seqlen_k": c["ctx"] + c["q_len"],
        "softmax_scale": scale,
        "causal": True,
        "window_size": (-1, -1),
        "block_table": c["block_table"],
        "softcap": 0,
        "q_descale": None,
        "k_descale": descale,
        "v_descale": descale,
        "seq_threshold_3D": seq_threshold_3d,
        "num_par_softmax_segments": segments,
        "softmax_segm_output": segm_out,
        "softmax_segm_max": segm_max,
        "softmax_segm_expsum": torch.empty_like(segm_max),
    }


def vllm_unified_attention() -> Callable | None:
    """vLLM's ``unified_attention`` when vLLM imports, else None (the lent GPU machine
    has no vLLM: the gather + SDPA baseline is the one that always runs)."""
    import importlib

    try:
        return importlib.import_module(UNIFIED_ATTENTION).unified_attention
    except ImportError:
        return None


def make_vllm_runner(c: dict, scale: float) -> Callable[[torch.Tensor], None] | None:
    """Runner for vLLM's kernel on case ``c``, or None without vLLM."""
    unified_attention = vllm_unified_attention()
    if unified_attention is None:
        return None
    kwargs = unified_attention_kwargs(c, scale, torch.empty_like(c["query"]))

    def run(out: torch.Tensor) -> None:
        unified_attention(**{**kwargs, "out": out})

    return run


def sdpa_gather_bytes(c: dict) -> int:
    """Bytes of K/V that gather + SDPA materializes (heads repeated for GQA)."""
    q_heads, head = c["query"].shape[1:]
    return 2 * c["batch"] * (c["ctx"] + c["q_len"]) * q_heads * head * c["query"].element_size()


def make_sdpa_runner(c: dict, scale: float) -> Callable[[torch.Tensor], None]:
    """Gather each request's KV to contiguous memory (heads repeated for GQA, so that
    SDPA's memory-efficient kernel applies), then SDPA with a dense bool mask."""
    batch, q_len, ctx = c["batch"], c["q_len"], c["ctx"]
    device = c["query"].device
    seq, bs = ctx + q_len, c["key_cache"].shape[1]
    q_heads = c["query"].shape[1]
    group = q_heads // c["key_cache"].shape[2]
    pos = torch.arange(seq, device=device)
    blocks = c["block_table"].long()[:, pos // bs]  # [B, S]
    offs = (pos % bs).expand(batch, seq)
    mask = torch.ones(batch, 1, q_len, seq, dtype=torch.bool, device=device)
    for r, parents in enumerate(c["parents"]):
        mask[r, 0, :, ctx:] = kernels.tree_mask_dense(parents).to(device)
    q = c["query"].view(batch, q_len, *c["query"].shape[1:]).transpose(1, 2)

    def run(out: torch.Tensor) -> None:
        k = c["key_cache"][blocks, offs].repeat_interleave(group, dim=2).transpose(1, 2)
        v = c["value_cache"][blocks, offs].repeat_interleave(group, dim=2).transpose(1, 2)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        out.copy_(o.transpose(1, 2).reshape(out.shape))

    return run


COLUMNS = [
    ("batch", 5, "d"),
    ("ctx", 6, "d"),
    ("q", 4, "d"),
    ("tree_ms", 8, ".3f"),
    ("tree_GBs", 8, ".0f"),
    ("tree_TFs", 8, ".1f"),
    ("splits", 6, "d"),
    ("unsplit_ms", 10, ".3f"),
    ("vllm_ms", 8, ".3f"),
    ("vllm_GBs", 8, ".0f"),
    ("sdpa_ms", 8, ".3f"),
    ("sdpa_GBs", 8, ".0f"),
    ("err", 7, ".1e"),
]


def format_header() -> str:
    return " ".join(f"{name:>{width}}" for name, width, _ in COLUMNS)


def format_row(row: dict) -> str:
    """One table line; missing or None values (a skipped baseline) print as '-'."""
    cells = []
    for name, width, fmt in COLUMNS:
        value = row.get(name)
        cells.append(f"{'-':>{width}}" if value is None else f"{value:>{width}{fmt}}")
    return " ".join(cells)


def attention_row(
    batch: int,
    ctx: int,
    q_len: int,
    shape: Shape,
    tree_ms: float,
    vllm_ms: float | None,
    sdpa_ms: float | None,
    err: float,
    splits: int | None = None,
    unsplit_ms: float | None = None,
) -> dict:
    num_bytes = attention_bytes(batch, ctx, q_len, shape)
    flops = attention_flops(batch, ctx, q_len, shape)
    return {
        "batch": batch,
        "ctx": ctx,
        "q": q_len,
        "tree_ms": tree_ms,
        "tree_GBs": gbps(num_bytes, tree_ms),
        "tree_TFs": flops / tree_ms / 1e9,
        "splits": splits,
        "unsplit_ms": unsplit_ms,
        "vllm_ms": vllm_ms,
        "vllm_GBs": gbps(num_bytes, vllm_ms),
        "sdpa_ms": sdpa_ms,
        "sdpa_GBs": gbps(num_bytes, sdpa_ms),
        "err": err,
    }


def copy_bandwidth_gbps(num_bytes: int = 2**32) -> float:
    """Measured memory ceiling: a large device-to-device copy, read + write bytes."""
    src = torch.empty(num_bytes // 2, dtype=torch.int16, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return gbps(2 * num_bytes, ms)


def bench(fn: Callable[[torch.Tensor], None], out: torch.Tensor) -> float:
    """Median milliseconds (CUDA events via do_bench; warm-up and repeat in ms)."""
    return triton.testing.do_bench(lambda: fn(out), warmup=25, rep=100, return_mode="median")


def bench_tree_attention(args: argparse.Namespace, shape: Shape, writer) -> bool:
    """Print the attention table; return False if any case failed its error bound."""
    scale = shape.head_size**-0.5
    print(
        f"tree attention, {args.dtype}, {shape.q_heads} q heads / {shape.kv_heads} kv "
        f"heads, head {shape.head_size}, block {shape.block_size}; GB/s = floor bytes "
        f"/ time, TF = TFLOP/s"
    )
    if vllm_unified_attention() is None:
        print("vLLM not importable: no unified_attention baseline (vllm_* columns '-')")
    print(format_header())
    ok = True
    for batch, ctx, q_len in case_grid(args.quick):
        c = make_case(batch, ctx, q_len, shape)
        out = torch.full_like(c["query"], float("nan"))
        run_tree(c, out, scale)
        err = reference_error(c, out, scale)
        splits, unsplit_ms = kv_splits(c, shape), None
        if splits > 1:  # the same kernel without split-KV, and its own error
            one = torch.full_like(out, float("nan"))
            run_tree(c, one, scale, num_kv_splits=1)
            errs = [err, reference_error(c, one, scale)]
            err = float("nan") if any(map(math.isnan, errs)) else max(errs)
            unsplit_ms = bench(lambda o, c=c: run_tree(c, o, scale, num_kv_splits=1), one)
        if not err < TOL[shape.dtype]:  # NaN fails too
            ok = False
        tree_ms = bench(lambda o, c=c: run_tree(c, o, scale), out)
        vllm_run = make_vllm_runner(c, scale)
        vllm_ms = bench(vllm_run, torch.empty_like(out)) if vllm_run else None
        sdpa_ms = None
        if sdpa_gather_bytes(c) <= args.sdpa_max_gb * 1e9:
            sdpa_ms = bench(make_sdpa_runner(c, scale), torch.empty_like(out))
        row = attention_row(
            batch, ctx, q_len, shape, tree_ms, vllm_ms, sdpa_ms, err, splits, unsplit_ms
        )
        print(format_row(row) + ("" if err < TOL[shape.dtype] else "  <-- ERROR"))
        if writer:
            writer.writerow(["tree_attention"] + [row[name] for name, _, _ in COLUMNS])
        del c, out
        torch.cuda.empty_cache()  # large cases one after another
    return ok


def compaction_pairs(
    batch: int, pairs_per_req: int, blocks_per_req: int, block_size: int, gen
) -> tuple[list[int], list[int], list[int]]:
    """Request r owns blocks r*blocks_per_req...; x at logical index 40; accepted
    block indices drawn from 1..20, moved to 41, 42, ... (PTD step 4)."""
    src, dst, starts = [], [], [0]
    for r in range(batch):
        base = r * blocks_per_req * block_size
        accepted = sorted((torch.randperm(20, generator=gen)[:pairs_per_req] + 1).tolist())
        src += [base + 40 + a for a in accepted]
        dst += [base + 41 + j for j in range(pairs_per_req)]
        starts.append(len(src))
    return src, dst, starts


def time_compaction(
    batch: int, pairs_per_req: int, num_layers: int, shape: Shape
) -> tuple[float, float, bool, int]:
    """(Triton ms, PyTorch ms, Triton result correct, bytes moved) for one case."""
    blocks_per_req = 8
    num_blocks = batch * blocks_per_req
    cache_shape = (num_blocks, shape.block_size, shape.kv_heads, shape.head_size)
    caches = [
        tuple(torch.randn(cache_shape, device="cuda").to(shape.dtype) for _ in range(2))
        for _ in range(num_layers)
    ]
    gen = torch.Generator().manual_seed(batch)
    pairs = compaction_pairs(batch, pairs_per_req, blocks_per_req, shape.block_size, gen)
    src, dst, starts = (torch.tensor(x, device="cuda") for x in pairs)
    # Correctness once (the kernel is order-sensitive), then time: repeated calls
    # move the same pairs again (slot values change, bytes moved do not).
    expected = [(k.clone(), v.clone()) for k, v in caches]
    kernels.compact_kv_torch(expected, src, dst, layout="cuda")
    kernels.compact_kv(caches, src, dst, starts, layout="cuda", validate=True)
    same = all(torch.equal(a, b) for pa, pb in zip(caches, expected) for a, b in zip(pa, pb))
    t_triton = triton.testing.do_bench(
        lambda: kernels.compact_kv(caches, src, dst, starts, layout="cuda"),
        return_mode="median",
    )
    t_torch = triton.testing.do_bench(
        lambda: kernels.compact_kv_torch(caches, src, dst, layout="cuda"),
        return_mode="median",
    )
    return t_triton, t_torch, same, compaction_bytes(len(pairs[0]), num_layers, shape)


def bench_compaction(args: argparse.Namespace, shape: Shape, writer) -> bool:
    num_layers = 32
    cases = [(1, 6), (64, 6)] if args.quick else [(1, 6), (16, 6), (64, 6), (64, 12)]
    print(f"\nKV compaction, {num_layers} layers, {args.dtype} (Triton: one launch)")
    print(f"{'batch':>5} {'pairs':>5} | {'triton ms':>9} {'GB/s':>6} | {'torch ms':>9} {'GB/s':>6}")
    ok = True
    for batch, pairs_per_req in cases:
        t_triton, t_torch, same, num_bytes = time_compaction(
            batch, pairs_per_req, num_layers, shape
        )
        ok &= same
        print(
            f"{batch:>5} {pairs_per_req:>5} | {t_triton:9.4f} {gbps(num_bytes, t_triton):6.0f} |"
            f" {t_torch:9.4f} {gbps(num_bytes, t_torch):6.0f}" + ("" if same else "  <-- ERROR")
        )
        if writer:
            writer.writerow(
                ["kv_compaction", batch, num_layers, pairs_per_req, t_triton, t_torch, same]
            )
        torch.cuda.empty_cache()
    return ok


SWEEP_SPLITS = [1, 2, 4, 8, 16, 32]


def sweep_kv_splits(shape: Shape) -> None:
    """Tree-kernel milliseconds per forced number of split-KV slices, beside the number
    the kernel picks (``choose_kv_splits``): the check of its thresholds."""
    scale = shape.head_size**-0.5
    print("split-KV sweep: tree kernel ms per forced slice count; 'picked' = automatic")
    print(f"{'batch':>5} {'ctx':>6} {'q':>4} | " + " ".join(f"{n:>7}" for n in SWEEP_SPLITS)
          + " | picked")
    for batch, ctx, q_len in itertools.product([1, 4, 16], [2048, 8192, 32768], [1, 16]):
        c = make_case(batch, ctx, q_len, shape)
        out = torch.empty_like(c["query"])
        times = [
            bench(lambda o, c=c, n=n: run_tree(c, o, scale, num_kv_splits=n), out)
            for n in SWEEP_SPLITS
        ]
        print(f"{batch:>5} {ctx:>6} {q_len:>4} | " + " ".join(f"{t:7.3f}" for t in times)
              + f" | {kv_splits(c, shape):>6}")
        del c, out
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sweep (about a minute)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-size", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--sdpa-max-gb",
        type=float,
        default=24.0,
        help="skip gather+SDPA when its gathered K/V would exceed this many GB",
    )
    parser.add_argument("--csv", type=str, default=None, help="also write rows here")
    parser.add_argument(
        "--sweep-splits", action="store_true", help="only the split-KV sweep (half a minute)"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_kernels.py needs a CUDA GPU (torch.cuda.is_available() is False).")
    shape = Shape(args.q_heads, args.kv_heads, args.head_size, args.block_size, DTYPES[args.dtype])
    print(
        torch.cuda.get_device_name(), "| torch", torch.__version__, "| triton", triton.__version__
    )
    print(f"device-to-device copy (ceiling): {copy_bandwidth_gbps():.0f} GB/s")
    if args.sweep_splits:
        sweep_kv_splits(shape)
        return
    with open(args.csv, "w", newline="") if args.csv else open("/dev/null", "w") as f:
        writer = csv.writer(f) if args.csv else None
        if writer:
            writer.writerow(["kind"] + [name for name, _, _ in COLUMNS])
        ok = bench_tree_attention(args, shape, writer)
        ok &= bench_compaction(args, shape, writer)
    if not ok:
        sys.exit("some cases failed their correctness check (marked ERROR above)")


if __name__ == "__main__":
    main()
