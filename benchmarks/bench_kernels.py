"""GPU benchmark of the PTD kernels (the fourth part of each kernel's quartet).

Tree attention vs (a) vLLM's Triton ``unified_attention`` on the same number of query
tokens with a causal mask (what a linear draft of equal size would cost), and (b)
gather-to-contiguous + PyTorch SDPA with a dense boolean mask. KV compaction (Triton)
vs the PyTorch path. Each tree-attention case is checked against SDPA before timing.

Achieved bandwidth counts the fewest bytes the work must move: every K/V row of every
sequence read once, queries read once, outputs written once (METHOD.md's floor).

Usage: python benchmarks/bench_kernels.py [--quick] [--dtype bf16] [--csv out.csv]
Needs a CUDA GPU; exits with a message otherwise.
"""

import argparse
import csv
import functools
import itertools
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    sys.exit("bench_kernels.py needs a CUDA GPU (torch.cuda.is_available() is False).")

import triton

try:
    from vllm_ptd import kernels
except ImportError:  # from a checkout: kernels/ is the package source
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import kernels  # type: ignore[no-redef]

DEVICE = "cuda"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def random_parents(n: int, gen: torch.Generator) -> list[int]:
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]


def make_case(batch: int, ctx: int, q_len: int, args: argparse.Namespace) -> dict:
    """Random paged batch: shuffled blocks, random trees, K/V of the block in place."""
    gen = torch.Generator().manual_seed(batch * 7919 + ctx * 31 + q_len)
    dtype, bs, dev = DTYPES[args.dtype], args.block_size, DEVICE
    seq = ctx + q_len
    blocks_per_req = triton.cdiv(seq, bs)
    num_blocks = batch * blocks_per_req
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    block_table = perm.view(batch, blocks_per_req).to(dev)
    shape = (num_blocks, bs, args.kv_heads, args.head_size)
    key_cache = torch.randn(shape, dtype=dtype, device=dev)
    value_cache = torch.randn(shape, dtype=dtype, device=dev)
    query = torch.randn(
        batch * q_len, args.q_heads, args.head_size, dtype=dtype, device=dev
    )
    parents = [random_parents(q_len, gen) for _ in range(batch)]
    mask_bits, mask_words = kernels.pack_tree_masks(parents, device=dev)
    return {
        "query": query,
        "key_cache": key_cache,
        "value_cache": value_cache,
        "block_table": block_table,
        "seq_lens": torch.full((batch,), seq, dtype=torch.int32, device=dev),
        "query_start_loc": torch.arange(
            0, batch * q_len + 1, q_len, dtype=torch.int32, device=dev
        ),
        "mask_bits": mask_bits,
        "mask_words": mask_words,
        "parents": parents,
        "batch": batch,
        "ctx": ctx,
        "q_len": q_len,
    }


def run_tree(c: dict, out: torch.Tensor, *, scale: float) -> None:
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
    )


def make_vllm_runner(c: dict, scale: float, kv_heads: int):
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention

    q_heads, head = c["query"].shape[1:]
    segments = 16
    seq_threshold_3d = 128 // kv_heads
    rows = max(seq_threshold_3d, c["query"].shape[0])
    segm_out = torch.empty(
        rows,
        q_heads,
        segments,
        triton.next_power_of_2(head),
        dtype=torch.float32,
        device=DEVICE,
    )
    segm_max = torch.empty(rows, q_heads, segments, dtype=torch.float32, device=DEVICE)
    segm_sum = torch.empty_like(segm_max)
    descale = torch.ones(c["batch"], kv_heads, device=DEVICE)
    seq = c["ctx"] + c["q_len"]

    def run(out: torch.Tensor) -> None:
        unified_attention(
            q=c["query"],
            k=c["key_cache"],
            v=c["value_cache"],
            out=out,
            cu_seqlens_q=c["query_start_loc"],
            max_seqlen_q=c["q_len"],
            seqused_k=c["seq_lens"],
            max_seqlen_k=seq,
            softmax_scale=scale,
            causal=True,
            window_size=(-1, -1),
            block_table=c["block_table"],
            softcap=0,
            q_descale=None,
            k_descale=descale,
            v_descale=descale,
            seq_threshold_3D=seq_threshold_3d,
            num_par_softmax_segments=segments,
            softmax_segm_output=segm_out,
            softmax_segm_max=segm_max,
            softmax_segm_expsum=segm_sum,
        )

    return run


def make_sdpa_runner(c: dict, scale: float):
    """Gather each request's KV to contiguous memory, then SDPA with a dense mask."""
    batch, q_len, ctx = c["batch"], c["q_len"], c["ctx"]
    seq, bs = ctx + q_len, c["key_cache"].shape[1]
    pos = torch.arange(seq, device=DEVICE)
    blocks = c["block_table"].long()[:, pos // bs]  # [B, S]
    offs = (pos % bs).expand(batch, seq)
    mask = torch.ones(batch, 1, q_len, seq, dtype=torch.bool, device=DEVICE)
    for r, parents in enumerate(c["parents"]):
        mask[r, 0, :, ctx:] = kernels.tree_mask_dense(parents).to(DEVICE)
    q = c["query"].view(batch, q_len, *c["query"].shape[1:]).transpose(1, 2)

    def run(out: torch.Tensor) -> None:
        k = c["key_cache"][blocks, offs].transpose(1, 2)  # [B, Hkv, S, D]
        v = c["value_cache"][blocks, offs].transpose(1, 2)
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=True
        )
        out.copy_(o.transpose(1, 2).reshape(out.shape))

    return run


def bench(fn, out: torch.Tensor) -> float:
    """Median milliseconds (CUDA events via do_bench)."""
    return triton.testing.do_bench(
        lambda: fn(out), warmup=25, rep=100, return_mode="median"
    )


def bench_tree_attention(args: argparse.Namespace, writer) -> None:
    ctxs = [512, 4096] if args.quick else [512, 2048, 8192, 32768]
    qs = [1, 16, 64] if args.quick else [1, 16, 64, 128]
    batches = [1, 16] if args.quick else [1, 8, 64]
    scale = args.head_size**-0.5
    print(
        f"tree attention, {args.dtype}, {args.q_heads} q heads / {args.kv_heads} kv "
        f"heads, head {args.head_size}, block {args.block_size}"
    )
    header = (
        f"{'batch':>5} {'ctx':>6} {'q':>4} | {'tree ms':>8} {'GB/s':>6} | "
        f"{'vllm ms':>8} {'GB/s':>6} | {'sdpa ms':>8} {'GB/s':>6} | {'err':>7}"
    )
    print(header)
    print("-" * len(header))
    for batch, ctx, q_len in itertools.product(batches, ctxs, qs):
        c = make_case(batch, ctx, q_len, args)
        elt = c["query"].element_size()
        kv_bytes = 2 * batch * (ctx + q_len) * args.kv_heads * args.head_size * elt
        gbytes = (kv_bytes + 2 * c["query"].numel() * elt) / 1e9
        out = torch.full_like(c["query"], float("nan"))
        ref = torch.empty_like(out)
        run_vllm = make_vllm_runner(c, scale, args.kv_heads)
        run_sdpa = make_sdpa_runner(c, scale)
        run_tree(c, out, scale=scale)
        run_sdpa(ref)
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        t_tree = bench(functools.partial(run_tree, c, scale=scale), out)
        t_vllm = bench(run_vllm, torch.empty_like(out))
        t_sdpa = bench(run_sdpa, ref)
        row = (
            batch,
            ctx,
            q_len,
            t_tree,
            gbytes / t_tree * 1e3,
            t_vllm,
            gbytes / t_vllm * 1e3,
            t_sdpa,
            gbytes / t_sdpa * 1e3,
            err,
        )
        print(
            f"{batch:>5} {ctx:>6} {q_len:>4} | {t_tree:8.3f} {row[4]:6.0f} | "
            f"{t_vllm:8.3f} {row[6]:6.0f} | {t_sdpa:8.3f} {row[8]:6.0f} | {err:7.1e}"
        )
        if writer:
            writer.writerow(("tree_attention",) + row)
        torch.cuda.empty_cache()  # large cases one after another


def bench_compaction(args: argparse.Namespace, writer) -> None:
    dtype, bs = DTYPES[args.dtype], args.block_size
    num_layers, batch, pairs_per_req = 32, 64, 6
    num_blocks = batch * 8
    caches = [
        tuple(
            torch.randn(
                num_blocks,
                bs,
                args.kv_heads,
                args.head_size,
                dtype=dtype,
                device=DEVICE,
            )
            for _ in range(2)
        )
        for _ in range(num_layers)
    ]
    src, dst, starts = [], [], [0]
    for r in range(batch):  # request r owns blocks 8r..8r+7; x at logical index 40
        base = r * 8 * bs
        accepted = sorted(torch.randperm(20)[:pairs_per_req].add(1).tolist())
        src += [base + 40 + a for a in accepted]
        dst += [base + 41 + j for j in range(pairs_per_req)]
        starts.append(len(src))
    src_t = torch.tensor(src, device=DEVICE)
    dst_t = torch.tensor(dst, device=DEVICE)
    starts_t = torch.tensor(starts, device=DEVICE)
    gbytes = (
        2
        * len(src)
        * num_layers
        * 2
        * args.kv_heads
        * args.head_size
        * caches[0][0].element_size()
        / 1e9
    )
    t_triton = triton.testing.do_bench(
        lambda: kernels.compact_kv(caches, src_t, dst_t, starts_t, layout="cuda"),
        return_mode="median",
    )
    t_torch = triton.testing.do_bench(
        lambda: kernels.compact_kv_torch(caches, src_t, dst_t, layout="cuda"),
        return_mode="median",
    )
    print(
        f"\nKV compaction: {num_layers} layers, {batch} requests x {pairs_per_req} "
        f"pairs: triton {t_triton:.3f} ms ({gbytes / t_triton * 1e3:.0f} GB/s), "
        f"torch {t_torch:.3f} ms ({gbytes / t_torch * 1e3:.0f} GB/s)"
    )
    if writer:
        writer.writerow(
            (
                "kv_compaction",
                batch,
                num_layers,
                pairs_per_req,
                t_triton,
                gbytes / t_triton * 1e3,
                t_torch,
                gbytes / t_torch * 1e3,
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sweep")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-size", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--csv", type=str, default=None, help="also write rows here")
    args = parser.parse_args()
    print(torch.cuda.get_device_name())
    with open(args.csv, "w", newline="") if args.csv else open("/dev/null", "w") as f:
        writer = csv.writer(f) if args.csv else None
        bench_tree_attention(args, writer)
        bench_compaction(args, writer)


if __name__ == "__main__":
    main()
