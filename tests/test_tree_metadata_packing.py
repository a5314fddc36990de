"""The runner's CUDA metadata path: per-request tree masks packed for the Triton backend."""

from __future__ import annotations

import numpy as np
import pytest
import torch

# The packing lives in the vLLM runner glue: without vLLM (the lent GPU machine) skip.
pytest.importorskip("vllm", reason="pack_batch_tree_masks is part of the vLLM runner glue")

from vllm_ptd.kernels.tree_mask import tree_mask_dense, unpack_mask_bits

from vllm_ptd.attention.tree_metadata import TreeBlock
from vllm_ptd.vllm_integration.tree_step import pack_batch_tree_masks


def test_tree_rows_carry_their_masks_and_other_rows_are_flagged_causal():
    # Batch: a 5-token prefill chunk, a 4-node tree, a plain decode row, a 40-node tree.
    small = [-1, 0, 0, 1]
    big = [-1] + [max(0, i - 2) for i in range(1, 40)]
    blocks = [TreeBlock(1, 5, 4, tree_mask_dense(small)), TreeBlock(3, 10, 40, tree_mask_dense(big))]
    bits, words, is_tree = pack_batch_tree_masks(blocks, np.array([5, 4, 1, 40]))
    assert words == 2 and bits.shape == (50, 2)
    assert is_tree.tolist() == [0, 1, 0, 1]
    assert torch.equal(unpack_mask_bits(bits[5:9], 4), tree_mask_dense(small))
    assert torch.equal(unpack_mask_bits(bits[10:50], 40), tree_mask_dense(big))
    assert int(bits[:5].abs().sum()) == 0 and int(bits[9].abs().sum()) == 0
