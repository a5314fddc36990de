"""Per-step tree attention metadata, handed from the model runner to the backends.

A step that carries PTD trees builds one :class:`TreeAttentionMetadata` (part of the step's
``TreeStep``, vllm_integration/tree_step.py). It rides on vLLM's own per-layer attention
metadata as the attribute ``ptd_tree`` (:func:`attach_tree`, called right after vLLM built
that metadata), so every attention layer of the pass reads the same object from the
metadata it is given; a layer whose metadata has no tree runs vLLM's attention unchanged.

Row alignment: ``mask_bits`` rows follow the batch's flattened query tokens exactly
(row t = query token t, same order as vLLM's ``query_start_loc``), so when the
scheduler truncates a request's drafts the runner slices its parent array to the DFS
prefix it kept and packs again (see ``vllm_ptd.kernels.pack_tree_masks``).
"""

from dataclasses import dataclass, field

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
    # Backend plans shared by every layer of the step, built by the first layer that needs
    # one (the CPU backend's gather indices and biases), keyed by the backend.
    plans: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mask_bits.dtype != torch.int32 or self.mask_bits.dim() != 2:
            raise ValueError("mask_bits must be int32 [num_tokens, mask_words]")
        if self.mask_bits.shape[1] < self.mask_words:
            raise ValueError("mask_bits is narrower than mask_words")


TREE_ATTRIBUTE = "ptd_tree"


def attach_tree(per_layer_metadata, tree: TreeAttentionMetadata | None) -> None:
    """Put this step's tree (or None) on every layer's attention metadata. vLLM's
    ``per_layer_metadata`` is {layer name: metadata}, or a list of such dicts with
    micro-batching; layers of one group share one metadata object."""
    groups = per_layer_metadata if isinstance(per_layer_metadata, list) else [per_layer_metadata]
    if tree is not None and len(groups) > 1:
        # Tree rows index the whole batch; micro-batches would each see a slice of it.
        raise ValueError("PTD trees do not support micro-batching (dual batch overlap)")
    for group in groups:
        for metadata in (group or {}).values():
            if metadata is not None:
                setattr(metadata, TREE_ATTRIBUTE, tree)


# Class attribute of PTD's Triton backend: it reads packed mask bits and keeps vLLM's
# unpacked [num_blocks, num_kv_heads, block_size, 2 * head_size] KV cache per layer.
PACKED_TREE_MASKS = "ptd_packed_tree_masks"


def uses_packed_tree_backend(runner) -> bool:
    """Whether the runner's attention layers run PTD's Triton backend (packed tree masks,
    Triton KV compaction) rather than the CPU backend (dense masks, the CPU cache packing).

    Read from the backend vLLM chose, not from the device: the device only decides which
    backend a platform picks by default, and a step's masks and KV moves must match the
    backend that reads them. Before vLLM built its attention groups the device decides.
    """
    for groups in getattr(runner, "attn_groups", None) or ():
        for group in groups:
            return bool(getattr(group.backend, PACKED_TREE_MASKS, False))
    return runner.device.type != "cpu"


def tree_of(attn_metadata) -> TreeAttentionMetadata | None:
    """The tree a layer's attention metadata carries this step, or None (a plain step)."""
    return getattr(attn_metadata, TREE_ATTRIBUTE, None)
