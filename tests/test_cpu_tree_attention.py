"""The CPU backend's batched tree attention against a float64 dense reference, on a KV cache
packed by vLLM's own CPU writer (whatever this machine's ISA packing is)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tree_attention_reference import dense_tree_attention, random_layout

from vllm_ptd.attention.tree_metadata import TreeBlock
from vllm_ptd.vllm_integration import cpu_tree_attention as cta
from vllm_ptd.vllm_integration.cpu_kv_layout import probe_layout, write_kv
from vllm_ptd.vllm_integration.cpu_tree_attention import build_step_plan, tree_attention_rows


@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("generic_packing", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_tree_attention_matches_dense_reference(dtype, seed, generic_packing,
                                                        block_size) -> None:
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    kv_heads, group, head_size, num_blocks = 3, 3, 64, 40
    isa = _get_attn_isa(dtype, block_size, head_size, "auto")
    layout = probe_layout(isa, dtype, block_size, head_size)
    # Unwritten slots hold large finite garbage (vLLM's cache is zero-allocated and only
    # holds model K/V, so never NaN): any of it leaking into a row shows up in the result.
    cache = (torch.randn(num_blocks, kv_heads, block_size, 2 * head_size, generator=gen)
             * 1e3).to(dtype)
    # Three requests (the middle one without a tree), non-contiguous shuffled blocks.
    sizes = [7, 4, 13]
    prefixes = [37, 20, 16] if block_size == 16 else [300, 20, 128]
    perm = torch.randperm(num_blocks, generator=gen)
    block_table = torch.zeros(3, 24, dtype=torch.int32)
    keys, values, blocks, seq_lens, start = [], [], [], [], 0
    used = 0
    for r, (n, prefix) in enumerate(zip(sizes, prefixes)):
        length = prefix + n
        nb = -(-length // block_size)
        block_table[r, :nb] = perm[used: used + nb]
        used += nb
        k = torch.randn(length, kv_heads, head_size, generator=gen).to(dtype)
        v = torch.randn(length, kv_heads, head_size, generator=gen).to(dtype)
        pos = torch.arange(length)
        slots = block_table[r, pos // block_size].long() * block_size + pos % block_size
        write_kv(cache, k, v, slots, isa)
        keys.append(k)
        values.append(v)
        seq_lens.append(length)
        if r != 1:
            lay = random_layout(n, rng)
            blocks.append((TreeBlock(r, start, n, torch.from_numpy(lay.ancestor_mask())), lay))
        start += n
    total = start
    query = torch.randn(total, kv_heads * group * head_size, generator=gen).to(dtype)
    # generic: the flat-index path, used for packings that are not bit permutations
    packing = None if generic_packing else cta._packing(layout)
    plan = build_step_plan([b for b, _ in blocks], torch.tensor(seq_lens), block_table,
                           cache.shape, layout, group, packing, dtype)
    assert (plan.packing is None) == generic_packing
    scale = head_size ** -0.5
    got = tree_attention_rows(query, cache, plan, kv_heads, scale)

    expected_rows = [
        dense_tree_attention(query[blk.start: blk.start + blk.size], keys[blk.req_index],
                             values[blk.req_index], blk.mask, group, scale)
        for blk, _lay in blocks]
    expected = torch.cat(expected_rows)
    assert got.shape == expected.shape
    assert torch.equal(plan.out_rows, torch.cat([torch.arange(b.start, b.start + b.size)
                                                 for b, _ in blocks]))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size", [16, 32, 128])
@pytest.mark.parametrize("head_size", [64, 128])
def test_every_cpu_packing_of_this_machine_unpacks_by_permutation(dtype, block_size, head_size):
    """The fast path (whole-block gathers) must cover the packings vLLM picks here; the
    description is verified element by element against the probe inside span_permutation."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from vllm_ptd.vllm_integration.cpu_kv_layout import span_permutation

    isa = _get_attn_isa(dtype, block_size, head_size, "auto")
    layout = probe_layout(isa, dtype, block_size, head_size)
    assert span_permutation(layout.key_index, token_major=True) is not None, isa
    assert span_permutation(layout.value_index, token_major=True) is not None, isa
