"""Float64 dense tree attention, the reference of the CPU tree-attention tests."""

from __future__ import annotations

import numpy as np
import torch

from vllm_ptd.core.layout import TreeLayout


def random_layout(n: int, rng: np.random.Generator) -> TreeLayout:
    parents = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)], dtype=np.int32)
    depths = np.zeros(n, dtype=np.int32)
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
    return TreeLayout(np.arange(n, dtype=np.int64), parents, depths, n - 1)


def dense_tree_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                         mask: torch.Tensor, group: int, scale: float) -> torch.Tensor:
    """query [n, kv_heads * group * hs] of a block whose n rows are the last n of the
    context keys/values [length, kv_heads, hs]; mask [n, n] over the block's own tokens.
    Returns [n, kv_heads * group * hs] in float64."""
    n = query.shape[0]
    length, kv_heads, head_size = keys.shape
    visible = torch.ones(n, length, dtype=torch.bool)
    visible[:, length - n:] = mask
    q = query.double().view(n, kv_heads, group, head_size)
    s = torch.einsum("nhgd,lhd->nhgl", q, keys.double()) * scale
    s = s.masked_fill(~visible[:, None, None, :], float("-inf"))
    return torch.einsum("nhgl,lhd->nhgd", s.softmax(-1), values.double()).reshape(n, -1)
