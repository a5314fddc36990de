"""Time one layer of CPU tree attention: gathering the context from the paged KV cache against
attending through the request's KV mirror (steady state: one accepted node to refresh), and
vLLM's own CPU extend kernel (`torch.ops._C.extend_attention_cpu`, SGLang's, with its
`tree_mask`) reading the same mirror in place of the mirror path's SDPA call.

    python benchmarks/bench_cpu_tree_attention.py --rows 13 16 25 --context 300 1000

All paths run on the same cache (packed by vLLM's own CPU writer, bf16), one thread like
vLLM's CPU worker; they are timed alternately, so the ratios are robust to a noisy machine.
The extend kernel's output is checked against the mirror path's before timing.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

KV_HEADS, GROUP, HEAD_SIZE, BLOCK_SIZE = 3, 3, 64, 128   # SmolLM2-135M's attention


def _layout(n: int, rng: np.random.Generator):
    from vllm_ptd.core.layout import TreeLayout

    parents = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)], dtype=np.int32)
    depths = np.zeros(n, dtype=np.int32)
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
    return TreeLayout(np.arange(n, dtype=np.int64), parents, depths, n - 1)


def time_layer(rows: int, context: int, iters: int,
               dtype=torch.bfloat16) -> tuple[float, float, float]:
    """(gather, mirror, extend) µs per layer for a `rows`-row tree after `context` tokens."""
    from types import SimpleNamespace

    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from vllm_ptd.attention.tree_metadata import TreeAttentionMetadata, TreeBlock
    from vllm_ptd.vllm_integration import cpu_tree_attention as cta
    from vllm_ptd.vllm_integration.cpu_kv_mirror import KVMirrorStore, mirrored_attention

    rng = np.random.default_rng(0)
    isa = _get_attn_isa(dtype, BLOCK_SIZE, HEAD_SIZE, "auto")
    length = context + rows
    num_blocks = -(-length // BLOCK_SIZE)
    cache = torch.randn(num_blocks + 2, KV_HEADS, BLOCK_SIZE, 2 * HEAD_SIZE).to(dtype)
    block_table = torch.arange(num_blocks, dtype=torch.int32)[None]
    mask = torch.from_numpy(_layout(rows, rng).ancestor_mask())
    query = torch.randn(rows, KV_HEADS * GROUP * HEAD_SIZE).to(dtype)
    key = torch.randn(rows, KV_HEADS * HEAD_SIZE).to(dtype)
    value = torch.randn(rows, KV_HEADS * HEAD_SIZE).to(dtype)
    output = torch.empty_like(query)
    attn = SimpleNamespace(seq_lens=torch.tensor([length]), block_table=block_table)
    scale = HEAD_SIZE ** -0.5

    def plans(store):
        tree = TreeAttentionMetadata(torch.zeros(0, 1, dtype=torch.int32), 1, None,
                                     [TreeBlock(0, 0, rows, mask, "r")], store)
        return cta._step_plans(tree, attn, cache, isa, GROUP)

    gathered = plans(None).gathered
    store = KVMirrorStore(num_layers=1)
    mirrored = plans(store)

    def gather():
        out = cta.tree_attention_rows(query, cache, gathered, KV_HEADS, scale)
        output.index_copy_(0, gathered.out_rows, out)

    def mirror():
        blk = mirrored.mirrored[0]
        blk.mirror.valid["l"] = min(blk.mirror.valid.get("l", 0), context - 1)  # one to refresh
        mirrored_attention("l", blk, query, key, value, cache, output, mirrored.layout, scale)

    # vLLM's extend kernel over the mirror the mirror path keeps: the prefix from the buffer
    # (token-major view, strided), the tree rows from this layer's own K/V, the tree mask.
    mirror()
    blk = mirrored.mirrored[0]
    buf = blk.mirror.buffer("l", KV_HEADS, HEAD_SIZE, dtype)
    heads = KV_HEADS * GROUP
    q3 = query.view(rows, heads, HEAD_SIZE)
    k3, v3 = key.view(rows, KV_HEADS, HEAD_SIZE), value.view(rows, KV_HEADS, HEAD_SIZE)
    out3 = torch.empty_like(q3)
    to_token = torch.arange(length, dtype=torch.int32)[None]
    zero64, zero32 = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int32)
    seq_lens, rows_t = torch.tensor([length]), torch.tensor([rows], dtype=torch.int32)
    tree_mask = mask.reshape(-1).contiguous()

    def extend():
        torch.ops._C.extend_attention_cpu(
            q3, k3, v3, out3, buf[0].transpose(0, 1), buf[1].transpose(0, 1), to_token,
            zero64, seq_lens, rows_t, zero32, rows, scale, 0.0, False, 0, None, None,
            tree_mask)

    extend()
    torch.testing.assert_close(out3.float(), output.view_as(out3).float(), atol=2e-2, rtol=2e-2)

    spent = [0.0, 0.0, 0.0]
    for _ in range(iters):
        for k, f in enumerate((gather, mirror, extend)):
            start = time.perf_counter()
            f()
            spent[k] += time.perf_counter() - start
    return tuple(t / iters * 1e6 for t in spent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[13, 16, 25])
    parser.add_argument("--context", type=int, nargs="+", default=[300, 1000])
    parser.add_argument("--iters", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| tree rows | context | gather µs/layer | mirror µs/layer | extend on the mirror "
          "µs/layer | gather / mirror | extend / mirror |")
    print("|---|---|---|---|---|---|---|")
    for context in args.context:
        for rows in args.rows:
            time_layer(rows, context, 20)   # warm-up
            gather, mirror, extend = time_layer(rows, context, args.iters)
            print(f"| {rows} | {context} | {gather:.0f} | {mirror:.0f} | {extend:.0f} | "
                  f"{gather / mirror:.2f}x | {extend / mirror:.2f}x |")


if __name__ == "__main__":
    main()
