"""PTD kernels: tree attention over vLLM's paged KV cache and KV compaction.

Each kernel comes with a plain PyTorch reference (``*_ref`` / ``*_torch``), tests in
``tests/test_kernels_*.py`` and a GPU benchmark in ``benchmarks/bench_kernels.py``.
Importing this package imports Triton; set ``TRITON_INTERPRET=1`` before the first
Triton import to run the kernels on CPU tensors.
"""

from .kv_compaction import check_compaction_order, compact_kv, compact_kv_torch
from .tree_attention import check_supported, choose_kv_splits, tree_attention
from .tree_attention_ref import tree_attention_ref
from .tree_mask import (
    chain_parents,
    pack_bool_mask,
    pack_tree_masks,
    tree_mask_dense,
    unpack_mask_bits,
)

__all__ = [
    "chain_parents",
    "check_compaction_order",
    "check_supported",
    "choose_kv_splits",
    "compact_kv",
    "compact_kv_torch",
    "pack_bool_mask",
    "pack_tree_masks",
    "tree_attention",
    "tree_attention_ref",
    "tree_mask_dense",
    "unpack_mask_bits",
]
