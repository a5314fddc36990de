"""Plain PyTorch reference for :func:`.tree_attention.tree_attention`.

Gathers each request's K/V from the paged cache through the block table, builds the
full visibility (prefix all visible, in-block per the dense tree mask) and runs plain
softmax attention. Slow and simple on purpose: it is the ground truth for the tests
(run it in float64) and a readable statement of what the kernel computes.
"""

from collections.abc import Sequence

import torch

from .tree_mask import tree_mask_dense


def gather_paged(
    cache: torch.Tensor, block_table_row: torch.Tensor, length: int
) -> torch.Tensor:
    """Logical KV ``0 .. length-1`` of one request: ``[length, num_kv_heads, head]``.

    ``cache`` is ``[num_blocks, block_size, num_kv_heads, head_size]`` (any strides).
    """
    block_size = cache.shape[1]
    pos = torch.arange(length, device=cache.device)
    blocks = block_table_row.to(cache.device).long()[pos // block_size]
    return cache[blocks, pos % block_size]


def tree_attention_ref(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    parents_list: Sequence[Sequence[int] | torch.Tensor | None],
    scale: float,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Reference output ``[total_q, num_q_heads, head_size]`` in ``dtype``.

    ``parents_list[r]`` is request r's parent array, or ``None`` for a causal block.
    """
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    num_q_heads = query.shape[1]
    num_kv_heads = key_cache.shape[2]
    group = num_q_heads // num_kv_heads
    out = torch.empty(query.shape, dtype=dtype, device=query.device)
    for r, parents in enumerate(parents_list):
        q_len = qsl[r + 1] - qsl[r]
        if q_len == 0:
            continue
        ctx = lens[r] - q_len
        q = query[qsl[r] : qsl[r + 1]].to(dtype)  # [q, Hq, D]
        k = gather_paged(key_cache, block_table[r], lens[r]).to(dtype)  # [S, Hkv, D]
        v = gather_paged(value_cache, block_table[r], lens[r]).to(dtype)
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        if parents is None:
            in_block = torch.ones(q_len, q_len, dtype=torch.bool).tril()
        else:
            in_block = tree_mask_dense(parents)
        visible = torch.ones(q_len, lens[r], dtype=torch.bool)
        visible[:, ctx:] = in_block
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        scores = scores.masked_fill(~visible.to(query.device), float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[qsl[r] : qsl[r + 1]] = torch.einsum("hqk,khd->qhd", probs, v)
    return out
