"""One step's PTD trees, from input preparation to verification.

`build_tree_step` runs in the `_prepare_inputs` wrapper, after vLLM computed the slot mapping
from linear positions (so sibling nodes get distinct KV slots). For every request whose
scheduled drafts are the tree PTD proposed, it truncates the layout to what the scheduler
kept, reads the rows' KV slots and rewrites the nodes' positions to p + depth; for trees that
branch it builds the step's attention masks. The resulting `TreeStep` is held by the proposer
for the step (`PTDProposer.step`): the attention backends get its `attention` through vLLM's
per-layer metadata, verification gets its trees.

Nothing here writes proposer or runner state besides the positions; what went wrong is
returned in the step (`failed`, `foreign`) for the proposer to act on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from vllm_ptd.attention.tree_metadata import (
    TreeAttentionMetadata,
    TreeBlock,
    uses_packed_tree_backend,
)
from vllm_ptd.core.layout import TreeLayout
from vllm_ptd.vllm_integration.step_transfers import StepTransfers


@dataclass
class TreeInFlight:
    """One request's tree as run this step."""

    req_index: int        # the request's index in the runner's input batch
    start: int            # its first row in the flattened batch (x's row)
    layout: TreeLayout    # truncated to what the scheduler actually scheduled
    slots: np.ndarray     # int64 [len(layout)]: KV slots of its rows


@dataclass
class Failure:
    """A request's tree that failed this step: it commits the token plain decoding commits
    after x, whatever its other rows hold, and stops drafting."""

    req_index: int
    stage: str
    error: BaseException


@dataclass
class TreeStep:
    """What one forward step carries for PTD."""

    trees: dict[str, TreeInFlight] = field(default_factory=dict)
    failed: dict[str, Failure] = field(default_factory=dict)   # trees whose set-up failed
    # Requests whose scheduled drafts are not PTD's tree (vLLM replaced them): verified
    # linearly by vLLM this step.
    foreign: list[str] = field(default_factory=list)
    attention: TreeAttentionMetadata | None = None   # None: every row attends causally

    @property
    def masked_blocks(self) -> int:
        return 0 if self.attention is None else len(self.attention.blocks or ())

    @property
    def masked_rows(self) -> int:
        """Draft rows (besides each x) of the requests that needed tree attention."""
        blocks = () if self.attention is None else self.attention.blocks or ()
        return sum(block.size - 1 for block in blocks)

    def fail(self, req_id: str, req_index: int, stage: str, error: BaseException) -> None:
        self.trees.pop(req_id, None)
        self.failed.setdefault(req_id, Failure(req_index, stage, error))

    def depths(self) -> dict[str, int]:
        """Each tree's depth as run: the draft tokens on its longest path."""
        return {req_id: int(tree.layout.depths.max()) for req_id, tree in self.trees.items()}


def build_tree_step(runner, pending_layout: Callable[[str], TreeLayout | None], kv_mirrors,
                    transfers: StepTransfers, scheduler_output,
                    num_scheduled_tokens: np.ndarray) -> TreeStep:
    """The step's trees for the requests with scheduled drafts (runner: vLLM's model runner
    after its own `_prepare_inputs`; pending_layout: the proposer's layout of a request)."""
    step = TreeStep()
    query_start = runner.query_start_loc.np
    block_table = runner.input_batch.block_table.block_tables[0]
    rows, positions, blocks = [], [], []
    for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
        layout = pending_layout(req_id)
        idx = runner.input_batch.req_id_to_index[req_id]
        n = len(drafts) + 1
        if layout is None or not drafts or num_scheduled_tokens[idx] != n:
            continue
        try:
            planned = plan_tree(runner, req_id, idx, layout, drafts, query_start, block_table)
        except Exception as error:  # noqa: BLE001 (the proposer logs it; never take the engine down)
            step.fail(req_id, idx, "tree layout", error)
            continue
        if planned is None:
            step.foreign.append(req_id)
            continue
        tree, tree_positions, block = planned
        rows.append(np.arange(tree.start, tree.start + n))
        positions.append(tree_positions)
        step.trees[req_id] = tree
        if block is not None:   # chains are causal blocks: the backend's own kernel
            blocks.append(block)
    if not blocks:
        return step
    try:
        # Tree positions go in after the slot mapping was computed from linear positions.
        index_and_positions = transfers.upload(
            "positions", np.stack([np.concatenate(rows), np.concatenate(positions)]),
            torch.int64)
        runner.positions[index_and_positions[0]] = index_and_positions[1].to(
            runner.positions.dtype)
        step.attention = tree_attention_metadata(
            blocks, num_scheduled_tokens[: runner.input_batch.num_reqs], kv_mirrors, transfers,
            packed=uses_packed_tree_backend(runner))
    except Exception as error:  # noqa: BLE001 (the proposer logs it; never take the engine down)
        # No tree masks this step: every row attends causally. A masked request's x row
        # (its first, at position p either way) is still exactly plain decoding's row, so
        # it commits plain decoding's token from it; chains stay verified (their rows
        # attend causally anyway, at the linear positions).
        step.attention = None
        for blk in blocks:
            step.fail(blk.req_id, blk.req_index, "attention plan", error)
    return step


def plan_tree(runner, req_id: str, idx: int, layout: TreeLayout, drafts, query_start,
              block_table) -> tuple[TreeInFlight, np.ndarray, TreeBlock | None] | None:
    """One request's tree this step: the tree, its rows' tree positions and its attention
    block (None for a chain, which attends causally); None when the scheduled drafts are not
    its tree. block_table: vLLM's block table of the KV cache group."""
    n = len(drafts) + 1
    # The scheduler may keep only a prefix of the drafts (token budget, max_model_len); a
    # DFS prefix of the layout is still a valid tree.
    layout = layout.truncate(n)
    if layout.tokens[1:].tolist() != list(drafts):
        return None
    start = int(query_start[idx])
    p = int(runner.input_batch.num_computed_tokens_cpu[idx])
    tree = TreeInFlight(idx, start, layout, kv_slots(block_table, idx, p, n))
    block = None if layout.is_chain else TreeBlock(
        idx, start, n, torch.from_numpy(layout.ancestor_mask()), req_id)
    return tree, p + layout.depths.astype(np.int64), block


def kv_slots(block_table, idx: int, p: int, n: int) -> np.ndarray:
    """KV slots of linear positions p .. p+n-1 of request `idx`, from the host copy of the
    block table: what vLLM's slot mapping holds for them (no context parallelism, which
    PTD refuses), without reading it back from the device."""
    size = block_table.block_size
    positions = np.arange(p, p + n, dtype=np.int64)
    blocks = block_table.block_table.np[idx, positions // size].astype(np.int64)
    return blocks * size + positions % size


def tree_attention_metadata(blocks: list[TreeBlock], num_scheduled_tokens: np.ndarray,
                            kv_mirrors, transfers: StepTransfers,
                            packed: bool | None = None) -> TreeAttentionMetadata:
    """packed: the Triton backend reads the step (packed mask bits); else the CPU backend.
    None: decided by the transfers' device (the platform's default backend)."""
    if packed is None:
        packed = transfers.device.type != "cpu"
    if not packed:
        # The CPU backend attends per block from the dense masks (and the requests' KV
        # mirrors); no packed bits needed.
        return TreeAttentionMetadata(torch.zeros(0, 1, dtype=torch.int32), 1, None, blocks,
                                     kv_mirrors)
    bits, words, is_tree = pack_batch_tree_masks(blocks, num_scheduled_tokens)
    # One upload for both: the kernel reads them as two contiguous views.
    both = transfers.upload("masks", np.concatenate([bits.numpy().reshape(-1),
                                                     is_tree.numpy()]), torch.int32)
    return TreeAttentionMetadata(both[: bits.numel()].view(bits.shape), words,
                                 both[bits.numel():], blocks)


def pack_batch_tree_masks(blocks: list[TreeBlock], num_scheduled_tokens: np.ndarray
                          ) -> tuple[torch.Tensor, int, torch.Tensor]:
    """Packed ancestor bits for every row of the batch, for the Triton tree backend.

    Rows of requests without a tree stay zero: their is_tree flag is 0, so the kernel uses a
    causal mask there and never reads those rows.
    """
    from vllm_ptd.kernels.tree_mask import WORD_BITS, pack_bool_mask

    words = -(-max(b.size for b in blocks) // WORD_BITS)
    bits = torch.zeros(int(num_scheduled_tokens.sum()), words, dtype=torch.int32)
    is_tree = torch.zeros(len(num_scheduled_tokens), dtype=torch.int32)
    for blk in blocks:
        bits[blk.start: blk.start + blk.size] = pack_bool_mask(blk.mask, words)
        is_tree[blk.req_index] = 1
    return bits, words, is_tree
