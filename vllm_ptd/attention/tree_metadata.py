"""Per-step tree attention metadata, handed from the model runner to the backend.

The runner builds one :class:`TreeAttentionMetadata` per forward pass that carries PTD
query blocks, publishes it with :func:`set_tree_attention_metadata` before the model
runs, and clears it afterwards (or uses :func:`tree_attention_step`). Every attention
layer of that pass reads the same object; a step without one runs vLLM's attention
unchanged. A process-global holder is enough: one engine core runs one forward at a
time per worker, like vLLM's own forward context.

Row alignment: ``mask_bits`` rows follow the batch's flattened query tokens exactly
(row t = query token t, same order as vLLM's ``query_start_loc``), so when the
scheduler truncates a request's drafts the runner slices its parent array to the DFS
prefix it kept and packs again (see ``vllm_ptd.kernels.pack_tree_masks``).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass
class TreeBlock:
    """One request's tree query block: rows [start, start + size) of the batch."""

    req_index: int
    start: int
    size: int
    mask: torch.Tensor  # bool [size, size]: row i sees in-block column j
    req_id: str | None = None  # keys per-request backend state (the CPU KV mirrors)


@dataclass
class TreeAttentionMetadata:
    """Tree masks of one forward pass.

    Attributes:
        mask_bits: int32 ``[>= num_tokens, mask_words]`` on the attention device;
            bit ``j % 32`` of word ``j // 32`` in the row of query token i of request
            r is set iff i sees r's in-block token j (j is i or an ancestor of i).
            Built by ``vllm_ptd.kernels.pack_tree_masks`` from parent arrays.
        mask_words: words per row (``ceil(max tree size / 32)``).
        is_tree: int32 ``[num_reqs]``, 1 for requests whose block is a PTD tree,
            0 for causal blocks (prefill chunks, plain decode) whose mask rows are
            never read; ``None`` means every request is a tree.
    """

    mask_bits: torch.Tensor
    mask_words: int
    is_tree: torch.Tensor | None = None
    # Dense form for backends that attend per request in PyTorch (the CPU backend): one
    # TreeBlock per request whose block is a tree, in batch order.
    blocks: list["TreeBlock"] | None = None
    # The engine's CPU KV mirrors (cpu_kv_mirror.KVMirrorStore), or None not to use any.
    kv_mirrors: object | None = None

    def __post_init__(self) -> None:
        if self.mask_bits.dtype != torch.int32 or self.mask_bits.dim() != 2:
            raise ValueError("mask_bits must be int32 [num_tokens, mask_words]")
        if self.mask_bits.shape[1] < self.mask_words:
            raise ValueError("mask_bits is narrower than mask_words")


_current: TreeAttentionMetadata | None = None


def set_tree_attention_metadata(metadata: TreeAttentionMetadata | None) -> None:
    """Publish (or clear, with ``None``) the tree metadata of the next forward pass."""
    global _current
    _current = metadata


def get_tree_attention_metadata() -> TreeAttentionMetadata | None:
    """Tree metadata of the running forward pass, or ``None`` for a plain step."""
    return _current


@contextmanager
def tree_attention_step(metadata: TreeAttentionMetadata | None) -> Iterator[None]:
    """Publish ``metadata`` for the duration of one forward pass."""
    set_tree_attention_metadata(metadata)
    try:
        yield
    finally:
        set_tree_attention_metadata(None)
