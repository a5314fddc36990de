"""Tree masks: from per-request parent arrays to the packed bits the kernel reads.

Contract with the layout code. A request's query block (``[x; C; T]``, DFS or any
topological order) is described by a parent array ``parents`` (int32):
``parents[0] == -1`` and ``0 <= parents[i] < i`` for ``i > 0``. Row ``i`` of the block
sees in-block column ``j`` iff ``j == i`` or ``j`` is an ancestor of ``i``. Several
roots are allowed (any ``parents[i] == -1`` for ``i > 0`` starts a new tree that sees
only the committed prefix), which is how C and T are kept apart from each other.

Packed form (what :func:`vllm_ptd.kernels.tree_attention.tree_attention` reads):
``mask_bits`` int32 ``[total_q, mask_words]``, ``mask_words = ceil(max_q / 32)``;
bit ``j % 32`` of word ``j // 32`` of the row of query token ``i`` of request ``r``
(row ``query_start_loc[r] + i``) is set iff row ``i`` sees in-block column ``j``.
Rows are in the same order as the flattened query tokens, so the runner can slice
them exactly like ``query``.
"""

from collections.abc import Sequence

import torch

from vllm_ptd.core.layout import ancestor_mask

WORD_BITS = 32


def tree_mask_dense(parents: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Dense bool ``[n, n]`` in-block visibility: ``mask[i, j]`` = row i sees column j.

    Reference form of the mask (tests, the PyTorch attention reference, the CPU path). The
    mask is built by PTD's layout code (:func:`vllm_ptd.core.layout.ancestor_mask`, which
    also rejects parent arrays that break the contract above), so kernels and layouts agree
    by construction.
    """
    if isinstance(parents, torch.Tensor):
        parents = parents.cpu().numpy()
    return torch.from_numpy(ancestor_mask(parents))


def pack_bool_mask(dense: torch.Tensor, mask_words: int) -> torch.Tensor:
    """Pack bool ``[n, m]`` (m <= 32 * mask_words) into int32 words ``[n, mask_words]``."""
    n, m = dense.shape
    if m > WORD_BITS * mask_words:
        raise ValueError(f"{m} columns do not fit in {mask_words} words")
    padded = torch.zeros(n, mask_words * WORD_BITS, dtype=torch.int64)
    padded[:, :m] = dense.to(torch.int64)
    weights = torch.ones(WORD_BITS, dtype=torch.int64) << torch.arange(WORD_BITS)
    words = (padded.view(n, mask_words, WORD_BITS) * weights).sum(-1)
    # Reinterpret the unsigned 32-bit value as int32 (bit 31 becomes the sign bit).
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32)


def unpack_mask_bits(words: torch.Tensor, num_cols: int) -> torch.Tensor:
    """Inverse of :func:`pack_bool_mask`: int32 ``[n, W]`` -> bool ``[n, num_cols]``."""
    w = words.to(torch.int64).cpu() & 0xFFFFFFFF
    bits = (w.unsqueeze(-1) >> torch.arange(WORD_BITS)) & 1
    return bits.reshape(words.shape[0], -1)[:, :num_cols].bool()


def pack_tree_masks(
    parents_list: Sequence[Sequence[int] | torch.Tensor],
    device: torch.device | str | None = None,
    mask_words: int | None = None,
) -> tuple[torch.Tensor, int]:
    """Convert a batch of parent arrays into ``(mask_bits, mask_words)``.

    Args:
        parents_list: one parent array per request, in batch order; request r's
            block has ``len(parents_list[r])`` query tokens.
        device: where to put ``mask_bits`` (built on the host, copied once).
        mask_words: words per row; default ``ceil(max_q / 32)``. Pass a fixed value
            to keep the tensor shape stable across steps (e.g. for CUDA graphs).

    Returns:
        ``mask_bits`` int32 ``[total_q, mask_words]`` and ``mask_words``.
    """
    dense = [tree_mask_dense(p) for p in parents_list]
    max_q = max((d.shape[0] for d in dense), default=1)
    need = -(-max_q // WORD_BITS)
    if mask_words is None:
        mask_words = need
    elif mask_words < need:
        raise ValueError(f"mask_words={mask_words} < {need} needed for {max_q} tokens")
    if not dense:
        return torch.zeros(0, mask_words, dtype=torch.int32, device=device), mask_words
    bits = torch.cat([pack_bool_mask(d, mask_words) for d in dense])
    return bits.to(device), mask_words


def chain_parents(n: int) -> list[int]:
    """Parent array of a causal chain of n tokens (a plain decode row or prefill chunk)."""
    return list(range(-1, n - 1))
