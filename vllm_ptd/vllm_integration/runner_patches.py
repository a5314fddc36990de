"""Wrappers around vLLM 0.32's V1 model runner methods that carry PTD trees through a step.

Per step, for every request PTD drafted for:
1. `_update_states`: per-request PTD state is dropped for finished, preempted and resumed
   requests (a resumed request recomputes its KV, so its old layout is void).
2. `_prepare_inputs`: after vLLM computed the slot mapping from linear positions (so sibling
   nodes get distinct KV slots), the tree nodes' positions are rewritten to p + depth, and the
   per-request tree masks are published for the attention backend.
3. `_sample`: the candidate tree is verified against the distribution plain decoding would
   use at each row: the target's argmax for plain greedy requests, otherwise the rows vLLM's
   Sampler would build (tree_sampling.py); sampled requests draw each row's token as plain
   decoding would and follow the matching child (see `_verify_tree`).
   The request's row of the sampler output (accepted tokens, then the bonus, -1 padded:
   vLLM's contract) replaces the linear rejection sampler's, which PTD never needs; the
   accepted nodes' KV moves to the contiguous slots p+1.. (kv_compaction); the layout,
   argmax and result go to the proposer.
The scheduler's own rollback (`num_computed_tokens -= rejected`) then matches the KV.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import torch
from vllm.v1.outputs import SamplerOutput

from vllm_ptd.attention.tree_metadata import (
    TreeAttentionMetadata,
    TreeBlock,
    set_tree_attention_metadata,
)
from vllm_ptd.core.layout import TreeLayout
from vllm_ptd.core.verify import VerifyResult, verify_greedy
from vllm_ptd.vllm_integration.kv_compaction import compact_accepted_kv
from vllm_ptd.vllm_integration.tree_sampling import (
    TreeRowDistributions,
    alters_logits,
    has_penalties,
    is_greedy,
    top_k_top_p,
)

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
            finished = set(scheduler_output.finished_req_ids)
            gone = set(getattr(scheduler_output, "preempted_req_ids", None) or ())
            gone |= set(scheduler_output.scheduled_cached_reqs.resumed_req_ids or ())
            for req_id in finished:
                drafter.forget(req_id, finished=True)
            for req_id in gone - finished:
                drafter.forget(req_id)
        return original(self, scheduler_output)

    return _update_states


def make_input_fits_in_drafter(original):
    def _input_fits_in_drafter(self, common_attn_metadata):
        if ptd_drafter(self) is None:
            return original(self, common_attn_metadata)
        # vLLM skips the drafter for the whole batch once any sequence comes within
        # num_speculative_tokens of the drafter's max length (a limit of separate draft
        # models) and schedules zeros as drafts. PTD drafts with the target itself and keeps
        # each request's tree inside max_model_len (proposer budget), so it always drafts.
        if common_attn_metadata is not None:
            return True
        return original(self, common_attn_metadata)

    return _input_fits_in_drafter


def make_prepare_inputs(original):
    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        drafter = ptd_drafter(self)
        if drafter is None:
            return original(self, scheduler_output, num_scheduled_tokens)
        # Decode rows are one token per request plus its drafts; anything more is
        # prompt (prefill or a chunk of it).
        total = scheduler_output.total_num_scheduled_tokens
        spec = scheduler_output.scheduled_spec_decode_tokens
        decode = len(scheduler_output.num_scheduled_tokens) + sum(map(len, spec.values()))
        try:
            drafter.step_started(total, has_prefill=total > decode,
                                 drafting=sum(1 for drafts in spec.values() if drafts))
        except Exception:  # a lost step-time sample is not worth the engine
            logger.exception("PTD step timing failed")
        result = original(self, scheduler_output, num_scheduled_tokens)
        self._ptd_trees = {}
        set_tree_attention_metadata(None)
        if not scheduler_output.scheduled_spec_decode_tokens:
            return result
        query_start = self.query_start_loc.np
        slot_mapping = self.input_batch.block_table.block_tables[0].slot_mapping.gpu
        # Requests whose tree failed to be set up this step (req_id -> index): they commit
        # the token plain decoding commits after x (`make_sample`), whatever their rows hold.
        self._ptd_failed = {}
        rows, positions, blocks = [], [], []
        for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
            layout = drafter.pending.get(req_id)
            idx = self.input_batch.req_id_to_index[req_id]
            n = len(drafts) + 1
            if layout is None or not drafts or num_scheduled_tokens[idx] != n:
                continue
            try:
                planned = _plan_tree(self, req_id, idx, layout, drafts, query_start,
                                     slot_mapping)
            except Exception:  # noqa: BLE001 (logged in fall_back; never take the engine down)
                drafter.fall_back(req_id, "tree layout")
                self._ptd_failed[req_id] = idx
                continue
            if planned is None:
                # Not PTD's drafts (vLLM replaced them): no tree for this request this
                # step; vLLM verifies them as a linear chain, which stays exact.
                logger.warning("PTD: scheduled drafts of %s are not its tree; verified "
                               "linearly this step", req_id)
                drafter.pending.pop(req_id, None)
                continue
            tree, tree_positions, block = planned
            rows.append(np.arange(tree.start, tree.start + n))
            positions.append(tree_positions)
            self._ptd_trees[req_id] = tree
            if block is not None:   # chains are causal blocks: the backend's own kernel
                blocks.append(block)
        drafter.masked_blocks += len(blocks)
        if not blocks:
            return result
        try:
            # Tree positions go in after the slot mapping was computed from linear positions.
            index = torch.from_numpy(np.concatenate(rows)).to(self.positions.device)
            self.positions[index] = torch.from_numpy(np.concatenate(positions)).to(
                self.positions.device, self.positions.dtype)
            set_tree_attention_metadata(
                _tree_metadata(blocks, self.positions.device,
                               num_scheduled_tokens[: self.input_batch.num_reqs],
                               drafter.kv_mirrors))
        except Exception:  # noqa: BLE001 (logged in fall_back; never take the engine down)
            # No tree masks this step: every row attends causally. A masked request's x row
            # (its first, at position p either way) is still exactly plain decoding's row, so
            # it commits plain decoding's token from it; chains stay verified (their rows
            # attend causally anyway, at the linear positions).
            set_tree_attention_metadata(None)
            for blk in blocks:
                self._ptd_trees.pop(blk.req_id, None)
                drafter.fall_back(blk.req_id, "attention plan")
                self._ptd_failed[blk.req_id] = blk.req_index
        return result

    return _prepare_inputs


def _plan_tree(runner, req_id: str, idx: int, layout: TreeLayout, drafts, query_start,
               slot_mapping) -> tuple[TreeInFlight, np.ndarray, TreeBlock | None] | None:
    """One request's tree this step: what `make_sample` verifies, its rows' tree positions
    and its attention block (None for a chain, which attends causally); None when the
    scheduled drafts are not its tree."""
    n = len(drafts) + 1
    # The scheduler may keep only a prefix of the drafts (token budget, max_model_len); a
    # DFS prefix of the layout is still a valid tree.
    layout = layout.truncate(n)
    if layout.tokens[1:].tolist() != list(drafts):
        return None
    start = int(query_start[idx])
    p = int(runner.input_batch.num_computed_tokens_cpu[idx])
    tree = TreeInFlight(idx, start, layout,
                        slot_mapping[start:start + n].to("cpu", torch.int64))
    block = None if layout.is_chain else TreeBlock(
        idx, start, n, torch.from_numpy(layout.ancestor_mask()), req_id)
    return tree, p + layout.depths.astype(np.int64), block


def _tree_metadata(blocks: list[TreeBlock], device: torch.device,
                   num_scheduled_tokens: np.ndarray, kv_mirrors) -> TreeAttentionMetadata:
    if device.type == "cpu":
        # The CPU backend attends per block from the dense masks (and the requests' KV
        # mirrors); no packed bits needed.
        return TreeAttentionMetadata(torch.zeros(0, 1, dtype=torch.int32), 1, None, blocks,
                                     kv_mirrors)
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
    """Row argmax of the float32 logits, first index on ties. On CPU through the op vLLM's
    own Sampler uses for greedy rows (`_C.greedy_argmax`), so a tree row picks exactly as
    plain decoding does; on an AVX-512 CPU 89 µs against numpy's 210 for 16 rows over a 49k
    vocabulary (43 against 27 for 6). On other devices on the device itself (first index on
    ties, as vLLM's sampler takes it), in the logits' own dtype: only the row indices cross to
    the host, not rows x vocabulary logits."""
    if logits.device.type == "cpu" and hasattr(torch.ops._C, "greedy_argmax"):
        return torch.ops._C.greedy_argmax(logits.detach().float()).view(-1).numpy()
    return logits.detach().argmax(dim=-1).cpu().numpy()


def _all_plain_greedy(runner, drafter) -> bool:
    """True when every request of the batch is greedy with nothing that alters its logits,
    so the target's argmax is exactly what vLLM's sampler would pick for each row."""
    if runner.input_batch.sampling_metadata.max_num_logprobs is not None:
        return False
    for req_id in runner.input_batch.req_ids:
        params = runner.requests[req_id].sampling_params
        if drafter.blocker(req_id, params) or not _plain_greedy(params):
            return False
    return True


def _plain_greedy(params) -> bool:
    return is_greedy(params) and not alters_logits(params)


def _row_distributions(runner, req_id: str, tree: TreeInFlight,
                       logits: torch.Tensor) -> TreeRowDistributions:
    req = runner.requests[req_id]
    if req.prompt_token_ids is None and has_penalties(req.sampling_params):
        raise ValueError("penalties need the prompt's token ids (prompt given as embeddings)")
    return TreeRowDistributions(logits, tree.layout, req.sampling_params,
                                req.prompt_token_ids or (), req.output_token_ids,
                                sample_row=_vllm_row_sampler(runner, req.generator))


def _vllm_row_sampler(runner, generator):
    """Draw one token from a row with vLLM's own top-k/top-p sampler and the request's
    generator, exactly as plain decoding draws each position's token (one row, one draw)."""
    def sample_row(scaled: torch.Tensor, params) -> int:
        k, p = top_k_top_p(params, 1, scaled.shape[-1], scaled.device)
        generators = {} if generator is None else {0: generator}
        token, _ = runner.sampler.topk_topp_sampler(scaled[None].clone(), generators, k, p)
        return int(token.view(-1)[0])

    return sample_row


def _verify_tree(runner, req_id: str, tree: TreeInFlight, logits: torch.Tensor,
                 raw_argmax: np.ndarray) -> tuple[VerifyResult, np.ndarray]:
    """Verify one request's tree against the token plain decoding would commit at each row.

    Greedy: the (processed) argmax. Sampled: a token drawn at each visited row from the
    row's exact distribution, one draw per committed position with the request's generator;
    the walk follows the child holding that token. Each committed token is distributed as in
    plain decoding, the acceptance probability equals the sequential rule's (sum of q over
    the children), and a seeded request draws the same random numbers as plain decoding.
    Returns the verdict and the per-row argmax to learn from (processed where computed).
    """
    req = runner.requests[req_id]
    params = req.sampling_params
    if _plain_greedy(params):
        return verify_greedy(tree.layout, raw_argmax), raw_argmax
    rows = _row_distributions(runner, req_id, tree, logits)
    verdict = verify_greedy(tree.layout, rows.argmax if is_greedy(params) else rows.sampled)
    node_argmax = raw_argmax.copy()
    for r, a in rows.computed_argmax().items():
        node_argmax[r] = a
    return verdict, node_argmax


def _plain_tokens(runner, logits: torch.Tensor, spec_decode_metadata, cu_sampled: np.ndarray,
                  req_indices: list[int], argmax: np.ndarray, all_plain_greedy: bool
                  ) -> dict[int, int]:
    """The token plain decoding commits after x for each of these requests (batch indices):
    what a request whose tree failed at any stage commits instead of its tree's path.

    Taken from vLLM's own choice at the request's x row, its first row this step: x attends
    to nothing after itself and sits at position p whether or not the tree's positions and
    masks were set, so its logits are plain decoding's. When the whole batch is plain greedy
    vLLM's sampler would take the row's argmax, which is already at hand; otherwise vLLM's
    Sampler runs on every request's x row with the batch's sampling metadata (allowed tokens,
    bad words, logits processors, penalties) and these requests' own generators only, so a
    seeded request draws exactly what plain decoding draws (its generator is back at its
    state before verification, see `_generator_state`). Other rows of this pass are unused;
    they draw from the global generator, as withheld rows do. No PTD code runs here.
    """
    counts = np.asarray(spec_decode_metadata.num_draft_tokens, dtype=np.int64) + 1
    x_rows = cu_sampled - counts
    if all_plain_greedy:
        return {i: int(argmax[x_rows[i]]) for i in req_indices}
    md = runner.input_batch.sampling_metadata
    wanted = set(req_indices)
    # No logprobs in this pass (a failed request's logprobs come from its x row like any
    # other, `_verified_logprobs`); no thinking budget state: PTD never drafts for requests
    # with one, and the budget's state must not advance twice in a step.
    md = replace(md, generators={i: g for i, g in md.generators.items() if i in wanted},
                 max_num_logprobs=None, logprob_token_ids=None,
                 thinking_budget_state_holder=None)
    runner.input_batch.update_async_output_token_ids()
    rows = logits[torch.from_numpy(x_rows).to(logits.device)]
    tokens = runner.sampler(logits=rows, sampling_metadata=md).sampled_token_ids
    tokens = tokens.view(-1).cpu()
    return {i: int(tokens[i]) for i in req_indices}


def _generator_state(runner, req_id: str):
    """(generator, state) of a sampled request with its own generator, else None: taken
    before verification draws from it, restored if its tree then fails, so the fallback draws
    what plain decoding draws."""
    req = runner.requests[req_id]
    if req.generator is None or is_greedy(req.sampling_params):
        return None
    return req.generator, req.generator.get_state()


def _restore_generator(saved) -> None:
    if saved is not None:
        saved[0].set_state(saved[1])


def _write_row(sampled: torch.Tensor, req_index: int, tokens: list[int]) -> None:
    """A request's row of the sampler output: its tokens, then -1 (vLLM's contract)."""
    row = torch.full((sampled.shape[1],), -1, dtype=sampled.dtype)
    row[: len(tokens)] = torch.tensor(tokens, dtype=sampled.dtype)
    sampled[req_index] = row.to(sampled.device)


@contextmanager
def _generators_withheld(runner, req_indices: set[int]):
    """Hide tree requests' generators from vLLM's sampler for this step: their tokens are
    drawn by tree verification, and a seeded request must consume exactly one draw per
    committed token, as in plain decoding. (vLLM's sampler still fills their rows, from the
    global generator; those rows are overwritten.)"""
    batch = runner.input_batch
    md = batch.sampling_metadata
    kept = {i: g for i, g in md.generators.items() if i not in req_indices}
    if len(kept) == len(md.generators):
        yield
        return
    batch.sampling_metadata = replace(md, generators=kept)
    try:
        yield
    finally:
        batch.sampling_metadata = md


def _sample_rows_without_tree(runner, drafter, logits: torch.Tensor, spec_decode_metadata,
                              width: int) -> SamplerOutput | None:
    """vLLM's plain Sampler on each request's last row only, or None when vLLM's rejection
    sampler must run instead (processed logprobs, logprobs of chosen ids, thinking budgets).

    For a request without drafts its last row is its only row, so this is exactly plain
    decoding; tree requests' rows are overwritten by tree verification. It avoids running
    the linear rejection sampler (softmax, top-k/top-p sorts) over every tree row. Logprobs
    are gathered afterwards for the whole batch (`_verified_logprobs`).
    """
    md = runner.input_batch.sampling_metadata
    holder = md.thinking_budget_state_holder
    if ((md.max_num_logprobs is not None and not drafter.raw_logprobs) or md.logprob_token_ids
            or (holder is not None and holder.has_tracked_requests())):
        return None
    runner.input_batch.update_async_output_token_ids()
    last_rows = runner.sampler(logits=logits[spec_decode_metadata.bonus_logits_indices],
                               sampling_metadata=replace(md, max_num_logprobs=None))
    sampled = torch.full((last_rows.sampled_token_ids.shape[0], width), -1,
                         dtype=torch.int32, device=logits.device)
    sampled[:, :1] = last_rows.sampled_token_ids
    return SamplerOutput(sampled, None)


def _verified_logprobs(runner, logits: torch.Tensor, sampled: torch.Tensor,
                       cu_sampled: np.ndarray, tree_paths: dict[int, list[int]]):
    """Logprobs of every output token in vLLM's spec-decode layout ([requests x width] rows,
    filtered later by the -1 placeholders), each from the logits row that predicted it: for
    a tree request, x and then the accepted nodes; otherwise the request's rows in order.
    Raw modes only (`raw_logprobs`: log-softmax of the raw logits; `raw_logits`)."""
    width = sampled.shape[1]
    starts = np.concatenate([[0], cu_sampled[:-1]])
    index = starts[:, None] + np.arange(width)[None, :]
    for req_index, path in tree_paths.items():
        index[req_index, : len(path)] = starts[req_index] + np.asarray(path)
    index = np.minimum(index, logits.shape[0] - 1).reshape(-1)
    rows = logits[torch.from_numpy(index).to(logits.device)].to(torch.float32)
    sampler = runner.sampler
    if sampler.logprobs_mode == "raw_logprobs":
        rows = sampler.compute_logprobs(rows)
    tokens = sampled.reshape(-1).to(torch.int64).clone()
    tokens[tokens < 0] = 0   # placeholders: filtered out by vLLM's parse_output
    return sampler.gather_logprobs(rows, runner.input_batch.sampling_metadata.max_num_logprobs,
                                   tokens)


def make_sample(original):
    def _sample(self, logits, spec_decode_metadata):
        drafter = ptd_drafter(self)
        if drafter is None:
            return original(self, logits, spec_decode_metadata)
        set_tree_attention_metadata(None)
        trees = getattr(self, "_ptd_trees", None) or {}
        if spec_decode_metadata is None:
            return original(self, logits, spec_decode_metadata)
        # Also without trees: the scheduler can cut every draft of a step (token budget,
        # max_model_len), and vLLM's rejection sampler fails on zero draft rows with top-k.
        argmax = _greedy_argmax(logits)
        cu_sampled = spec_decode_metadata.cu_num_sampled_tokens.cpu().numpy()
        width = int(np.diff(cu_sampled, prepend=0).max())
        # Requests whose tree failed (setup in `_prepare_inputs`, then verification or KV
        # compaction below): req_id -> batch index. They commit plain decoding's token after
        # x (`_plain_tokens`) and continue without drafts; the rest of the batch is unaffected.
        failed: dict[str, int] = dict(getattr(self, "_ptd_failed", None) or {})
        tree_rows = {tree.req_index for tree in trees.values()} | set(failed.values())
        untreed_drafts = any(count and idx not in tree_rows
                             for idx, count in enumerate(spec_decode_metadata.num_draft_tokens))
        all_plain_greedy = not untreed_drafts and _all_plain_greedy(self, drafter)
        if all_plain_greedy:
            # Every row is a plain argmax: skip vLLM's linear rejection sampler entirely.
            rows = np.full((len(cu_sampled), width), -1, dtype=np.int64)
            rows[:, 0] = argmax[cu_sampled - 1]   # no-draft requests: the bonus only
            output = SamplerOutput(torch.from_numpy(rows).to(logits.device, torch.int32), None)
        else:
            # Rows without a tree need vLLM's sampler; tree rows are overwritten below.
            with _generators_withheld(self, tree_rows):
                output = None
                if not untreed_drafts:
                    output = _sample_rows_without_tree(self, drafter, logits,
                                                       spec_decode_metadata, width)
                if output is None:
                    output = original(self, logits, spec_decode_metadata)
        sampled = output.sampled_token_ids
        verified = {}   # req_id -> (tree, verdict, generator state before verification)
        moves = {}      # req_id -> KV slot pairs (source, destination) of its accepted path
        for req_id, tree in trees.items():
            n = len(tree.layout)
            first = int(cu_sampled[tree.req_index]) - n
            saved = _generator_state(self, req_id)
            try:
                verdict, node_argmax = _verify_tree(self, req_id, tree, logits[first:first + n],
                                                    argmax[first:first + n])
                pairs = [(tree.slots[node], tree.slots[k])
                         for k, node in enumerate(verdict.accepted, start=1)
                         if node != k]   # already in place when the path is the DFS prefix
                drafter.record_step(req_id, tree.layout, node_argmax, verdict)
            except Exception:  # noqa: BLE001 (logged in fall_back; never take the engine down)
                _restore_generator(saved)
                drafter.records.pop(req_id, None)
                drafter.fall_back(req_id, "verification")
                failed[req_id] = tree.req_index
                continue
            verified[req_id] = (tree, verdict, saved)
            if pairs:
                moves[req_id] = pairs
        if moves:
            pairs = [pair for request_pairs in moves.values() for pair in request_pairs]
            try:
                compact_accepted_kv(self, torch.stack([src for src, _ in pairs]),
                                    torch.stack([dst for _, dst in pairs]))
                drafter.kv_moves += len(pairs)
            except Exception:  # noqa: BLE001 (logged in fall_back; never take the engine down)
                # Their accepted nodes' KV may be anywhere now, but only in their own tree
                # slots after x, which committing x's plain token alone leaves rejected.
                for req_id in moves:
                    tree, _, saved = verified.pop(req_id)
                    _restore_generator(saved)
                    drafter.records.pop(req_id, None)
                    drafter.fall_back(req_id, "KV compaction")
                    failed[req_id] = tree.req_index
        tree_paths: dict[int, list[int]] = {}   # req_index -> rows of its output tokens
        for tree, verdict, _ in verified.values():
            _write_row(sampled, tree.req_index, verdict.tokens)
            tree_paths[tree.req_index] = [0, *verdict.accepted]
        if failed:
            plain = _plain_tokens(self, logits, spec_decode_metadata, cu_sampled,
                                  sorted(failed.values()), argmax, all_plain_greedy)
            for req_index, token in plain.items():
                _write_row(sampled, req_index, [token])
                tree_paths[req_index] = [0]
        if (self.input_batch.sampling_metadata.max_num_logprobs is not None
                and drafter.raw_logprobs):
            output.logprobs_tensors = _verified_logprobs(self, logits, sampled, cu_sampled,
                                                         tree_paths)
        self._ptd_trees = {}
        self._ptd_failed = {}
        return output

    return _sample
