"""Wrappers around vLLM 0.32's V1 model runner methods that carry PTD trees through a step.

Per step, for every request PTD drafted for:
1. `_update_states`: per-request PTD state is dropped for finished, preempted and resumed
   requests (a resumed request recomputes its KV, so its old layout is void).
2. `_prepare_inputs`: after vLLM computed the slot mapping from linear positions (so sibling
   nodes get distinct KV slots), the tree nodes' positions are rewritten to p + depth, and the
   per-request tree masks are published for the attention backend.
3. `_sample`: the target's argmax at every node verifies the candidate tree; the request's
   row of the sampler output (accepted tokens, then the bonus, -1 padded: vLLM's contract)
   replaces the linear rejection sampler's; the accepted nodes' KV moves to the contiguous
   slots p+1.. (kv_compaction); the layout, argmax and result go to the proposer.
The scheduler's own rollback (`num_computed_tokens -= rejected`) then matches the KV.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from vllm.v1.outputs import SamplerOutput

from vllm_ptd.attention.tree_metadata import (
    TreeAttentionMetadata,
    TreeBlock,
    set_tree_attention_metadata,
)
from vllm_ptd.core.layout import TreeLayout
from vllm_ptd.core.verify import verify_greedy
from vllm_ptd.vllm_integration.kv_compaction import compact_accepted_kv

logger = logging.getLogger("vllm_ptd")


@dataclass
class TreeInFlight:
    req_index: int
    start: int           # first row of the request in the flattened batch
    layout: TreeLayout   # truncated to what the scheduler actually scheduled
    slots: torch.Tensor  # int64 [len(layout)] KV slots of the block's rows


def ptd_drafter(runner):
    """The runner's PTD proposer, or None when this runner does not run PTD."""
    from vllm_ptd.vllm_integration.proposer import PTDProposer

    drafter = getattr(runner, "drafter", None)
    if not isinstance(drafter, PTDProposer):
        return None
    if drafter.runner is None:
        if len(runner.input_batch.block_table.block_tables) != 1:
            raise ValueError("PTD supports models with a single KV cache group only")
        drafter.runner = runner
    return drafter


def make_update_states(original):
    def _update_states(self, scheduler_output):
        drafter = ptd_drafter(self)
        if drafter is not None:
            gone = set(scheduler_output.finished_req_ids)
            gone |= set(getattr(scheduler_output, "preempted_req_ids", None) or ())
            gone |= set(scheduler_output.scheduled_cached_reqs.resumed_req_ids or ())
            for req_id in gone:
                drafter.forget(req_id)
        return original(self, scheduler_output)

    return _update_states


def make_prepare_inputs(original):
    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        result = original(self, scheduler_output, num_scheduled_tokens)
        self._ptd_trees = {}
        set_tree_attention_metadata(None)
        drafter = ptd_drafter(self)
        if drafter is None or not scheduler_output.scheduled_spec_decode_tokens:
            return result
        query_start = self.query_start_loc.np
        slot_mapping = self.input_batch.block_table.block_tables[0].slot_mapping.gpu
        rows, positions, blocks = [], [], []
        for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
            layout = drafter.pending.get(req_id)
            idx = self.input_batch.req_id_to_index[req_id]
            n = len(drafts) + 1
            if layout is None or not drafts or num_scheduled_tokens[idx] != n:
                continue
            # The scheduler may keep only a prefix of the drafts (token budget,
            # max_model_len); a DFS prefix of the layout is still a valid tree.
            layout = layout.truncate(n)
            if layout.tokens[1:].tolist() != list(drafts):
                raise RuntimeError(f"PTD layout and scheduled drafts differ for {req_id}")
            start = int(query_start[idx])
            p = int(self.input_batch.num_computed_tokens_cpu[idx])
            rows.append(np.arange(start, start + n))
            positions.append(p + layout.depths.astype(np.int64))
            self._ptd_trees[req_id] = TreeInFlight(
                idx, start, layout, slot_mapping[start:start + n].to("cpu", torch.int64))
            blocks.append(TreeBlock(idx, start, n, torch.from_numpy(layout.ancestor_mask())))
        if not blocks:
            return result
        # Tree positions go in after the slot mapping was computed from linear positions.
        index = torch.from_numpy(np.concatenate(rows)).to(self.positions.device)
        self.positions[index] = torch.from_numpy(np.concatenate(positions)).to(
            self.positions.device, self.positions.dtype)
        set_tree_attention_metadata(
            _tree_metadata(blocks, self.positions.device,
                           num_scheduled_tokens[: self.input_batch.num_reqs]))
        return result

    return _prepare_inputs


def _tree_metadata(blocks: list[TreeBlock], device: torch.device,
                   num_scheduled_tokens: np.ndarray) -> TreeAttentionMetadata:
    if device.type == "cpu":
        # The CPU backend attends per block from the dense masks; no packed bits needed.
        return TreeAttentionMetadata(torch.zeros(0, 1, dtype=torch.int32), 1, None, blocks)
    bits, words, is_tree = pack_batch_tree_masks(blocks, num_scheduled_tokens)
    return TreeAttentionMetadata(bits.to(device), words, is_tree.to(device), blocks)


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


def _greedy_argmax(logits: torch.Tensor) -> np.ndarray:
    """Row argmax, first index on ties like torch.argmax; numpy's is ~8x faster on CPU."""
    return logits.detach().float().cpu().numpy().argmax(axis=-1)


def _all_plain_greedy(runner, drafter) -> bool:
    """True when every request of the batch is greedy with nothing that alters its logits,
    so the target's argmax is exactly what vLLM's sampler would pick for each row."""
    from vllm_ptd.vllm_integration.eligibility import draft_blocker

    for req_id in runner.input_batch.req_ids:
        if drafter.blocker(req_id, runner.requests[req_id].sampling_params, draft_blocker):
            return False
    return True


def make_sample(original):
    def _sample(self, logits, spec_decode_metadata):
        trees = getattr(self, "_ptd_trees", None)
        if not trees or spec_decode_metadata is None:
            set_tree_attention_metadata(None)
            return original(self, logits, spec_decode_metadata)
        set_tree_attention_metadata(None)
        drafter = ptd_drafter(self)
        argmax = _greedy_argmax(logits)
        cu_sampled = spec_decode_metadata.cu_num_sampled_tokens.cpu().numpy()
        width = int(np.diff(cu_sampled, prepend=0).max())
        tree_rows = {tree.req_index for tree in trees.values()}
        untreed_drafts = any(count and idx not in tree_rows
                             for idx, count in enumerate(spec_decode_metadata.num_draft_tokens))
        if not untreed_drafts and _all_plain_greedy(self, drafter):
            # Every row is a plain argmax: skip vLLM's linear rejection sampler entirely.
            rows = np.full((len(cu_sampled), width), -1, dtype=np.int64)
            rows[:, 0] = argmax[cu_sampled - 1]   # no-draft requests: the bonus only
            output = SamplerOutput(torch.from_numpy(rows).to(logits.device, torch.int32), None)
        else:
            output = original(self, logits, spec_decode_metadata)
        sampled = output.sampled_token_ids
        src, dst = [], []
        for req_id, tree in trees.items():
            n = len(tree.layout)
            first = int(cu_sampled[tree.req_index]) - n
            node_argmax = argmax[first:first + n]
            try:
                drafter.maybe_inject_fault("verify")
                verdict = verify_greedy(tree.layout, node_argmax)
            except Exception:  # noqa: BLE001 (logged in fall_back)
                # Never take the engine down: x's own argmax is the plain-decoding token
                # (tree requests are greedy), so commit just that and drop the tree.
                drafter.fall_back(req_id, "verification")
                tokens = [int(node_argmax[0])]
                verdict = None
            else:
                tokens = verdict.tokens
            row = torch.full((sampled.shape[1],), -1, dtype=sampled.dtype)
            row[: len(tokens)] = torch.tensor(tokens, dtype=sampled.dtype)
            sampled[tree.req_index] = row.to(sampled.device)
            if verdict is None:
                continue
            for k, node in enumerate(verdict.accepted, start=1):
                if node != k:  # already in place when the path is the DFS prefix
                    src.append(tree.slots[node])
                    dst.append(tree.slots[k])
            drafter.record_step(req_id, tree.layout, node_argmax, verdict)
        if src:
            compact_accepted_kv(self, torch.stack(src), torch.stack(dst))
            drafter.kv_moves += len(src)
        self._ptd_trees = {}
        return output

    return _sample
