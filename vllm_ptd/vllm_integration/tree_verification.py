"""Verification of one step's trees inside vLLM's `_sample`, returning verdicts.

Each tree is verified against the token plain decoding would commit at each row: the
target's argmax for plain greedy requests, otherwise the rows vLLM's Sampler would build
(tree_sampling.py); sampled requests draw each visited row's token as plain decoding would
and follow the matching child. A request's row of the sampler output (accepted tokens, then
the bonus, -1 padded: vLLM's contract) replaces the linear rejection sampler's, which PTD
never needs; the accepted nodes' KV moves to the contiguous slots p+1.. (kv_compaction). The
scheduler's own rollback (`num_computed_tokens -= rejected`) then matches the KV.

A request whose tree fails at any stage (set-up in tree_step.py, verification or compaction
here) commits the token vLLM's own sampler gives at its x row (`plain_tokens`), so its output
is plain decoding's. `sample_with_trees` writes the sampler output and KV; what the proposer
must learn or drop comes back as `StepVerdicts`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from vllm.v1.outputs import SamplerOutput

from vllm_ptd.core.layout import TreeLayout
from vllm_ptd.core.verify import VerifyResult, verify_greedy
from vllm_ptd.vllm_integration import kv_compaction
from vllm_ptd.vllm_integration.step_transfers import StepTransfers
from vllm_ptd.vllm_integration.tree_sampling import (
    TreeRowDistributions,
    alters_logits,
    has_penalties,
    is_greedy,
    top_k_top_p,
)
from vllm_ptd.vllm_integration.tree_step import Failure, TreeInFlight, TreeStep


@dataclass
class StepRecord:
    """What the proposer learns from one verified tree."""

    layout: TreeLayout
    argmax: np.ndarray    # the target's (processed where computed) choice at each row
    result: VerifyResult


@dataclass
class StepVerdicts:
    records: dict[str, StepRecord] = field(default_factory=dict)
    # trees that failed here (set-up failures are the step's own `failed`)
    failed: dict[str, Failure] = field(default_factory=dict)
    kv_moves: int = 0   # accepted nodes whose KV moved (paths off the DFS prefix)


# Rows converted to float32 at a time for the CPU argmax. Converting every row of a step of
# drafts at once (hundreds of rows x the vocabulary) allocated tens of MB a step, whose first
# touch cost more than the argmax itself: 176 rows x 49k, 10.5 ms at once against 2.6 ms in
# blocks of 16 through one reused buffer (the AMX CPU; 16 requests drafting ~10 rows each).
CPU_ARGMAX_ROWS = 16


def greedy_argmax(logits: torch.Tensor, transfers: StepTransfers) -> np.ndarray:
    """Row argmax of the logits, first index on ties. On CPU through the op vLLM's own
    Sampler uses for greedy rows (`_C.greedy_argmax`, float32: vLLM's Sampler converts the
    logits first; the conversion is exact, so blocks of rows give the same argmax), so a
    tree row picks exactly as plain decoding does; on an AVX-512 CPU 89 µs against numpy's
    210 for 16 rows over a 49k vocabulary. On other devices on the device itself, in the
    logits' own dtype: only the row indices cross to the host (the step's one read), not
    rows x vocabulary logits."""
    logits = logits.detach()
    if logits.device.type != "cpu" or not hasattr(torch.ops._C, "greedy_argmax"):
        return transfers.read(logits.argmax(dim=-1))
    if logits.dtype == torch.float32:
        return transfers.read(torch.ops._C.greedy_argmax(logits).view(-1))
    rows, vocab = logits.shape
    block = transfers.scratch("argmax", (min(rows, CPU_ARGMAX_ROWS), vocab), torch.float32)
    argmax = torch.empty(rows, dtype=torch.int64)
    for start in range(0, rows, CPU_ARGMAX_ROWS):
        view = block[: min(CPU_ARGMAX_ROWS, rows - start)]
        view.copy_(logits[start:start + len(view)])
        argmax[start:start + len(view)] = torch.ops._C.greedy_argmax(view).view(-1)
    return transfers.read(argmax)


def plain_greedy(params) -> bool:
    return is_greedy(params) and not alters_logits(params)


def all_plain_greedy(runner, blocker: Callable) -> bool:
    """True when every request of the batch is greedy with nothing that alters its logits,
    so the target's argmax is exactly what vLLM's sampler would pick for each row."""
    if runner.input_batch.sampling_metadata.max_num_logprobs is not None:
        return False
    for req_id in runner.input_batch.req_ids:
        params = runner.requests[req_id].sampling_params
        if blocker(req_id, params) or not plain_greedy(params):
            return False
    return True


def row_distributions(runner, req_id: str, tree: TreeInFlight,
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


def verify_tree(runner, req_id: str, tree: TreeInFlight, logits: torch.Tensor,
                raw_argmax: np.ndarray) -> tuple[VerifyResult, np.ndarray]:
    """Verify one request's tree against the token plain decoding would commit at each row.

    Greedy: the (processed) argmax. Sampled: a token drawn at each visited row from the
    row's exact distribution, one draw per committed position with the request's generator;
    the walk follows the child holding that token. Each committed token is distributed as in
    plain decoding, the acceptance probability equals the sequential rule's (sum of q over
    the children), and a seeded request draws the same random numbers as plain decoding.
    Returns the verdict and the per-row argmax to learn from (processed where computed).
    """
    params = runner.requests[req_id].sampling_params
    if plain_greedy(params):
        return verify_greedy(tree.layout, raw_argmax), raw_argmax
    rows = row_distributions(runner, req_id, tree, logits)
    verdict = verify_greedy(tree.layout, rows.argmax if is_greedy(params) else rows.sampled)
    node_argmax = raw_argmax.copy()
    for r, a in rows.computed_argmax().items():
        node_argmax[r] = a
    return verdict, node_argmax


def plain_tokens(runner, logits: torch.Tensor, x_rows: np.ndarray, req_indices: list[int],
                 argmax: np.ndarray, batch_plain_greedy: bool, transfers: StepTransfers
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
    state before verification). Other rows of this pass are unused; they draw from the global
    generator, as withheld rows do. No PTD code runs here.
    """
    if batch_plain_greedy:
        return {i: int(argmax[x_rows[i]]) for i in req_indices}
    md = runner.input_batch.sampling_metadata
    wanted = set(req_indices)
    # No logprobs in this pass (a failed request's logprobs come from its x row like any
    # other, `verified_logprobs`); no thinking budget state: PTD never drafts for requests
    # with one, and the budget's state must not advance twice in a step.
    md = replace(md, generators={i: g for i, g in md.generators.items() if i in wanted},
                 max_num_logprobs=None, logprob_token_ids=None,
                 thinking_budget_state_holder=None)
    runner.input_batch.update_async_output_token_ids()
    rows = logits[transfers.upload("x rows", x_rows, torch.int64)]
    tokens = transfers.read(runner.sampler(logits=rows, sampling_metadata=md)
                            .sampled_token_ids.view(-1))
    return {i: int(tokens[i]) for i in req_indices}


class _GeneratorStates:
    """Sampled requests' generator states before verification draws from them, restored
    if their tree then fails, so the fallback draws what plain decoding draws."""

    def __init__(self) -> None:
        self._saved: dict[str, tuple[torch.Generator, torch.Tensor]] = {}

    def save(self, runner, req_id: str) -> None:
        req = runner.requests[req_id]
        if req.generator is not None and not is_greedy(req.sampling_params):
            self._saved[req_id] = (req.generator, req.generator.get_state())

    def restore(self, req_id: str) -> None:
        saved = self._saved.pop(req_id, None)
        if saved is not None:
            saved[0].set_state(saved[1])


class _OutputRows:
    """Rows of the sampler output PTD writes: a request's tokens, then -1 (vLLM's
    contract), collected on the host and written in one upload."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.rows: dict[int, list[int]] = {}

    def write(self, req_index: int, tokens: list[int]) -> None:
        self.rows[req_index] = tokens

    def into(self, table: np.ndarray) -> np.ndarray:
        """Write the rows into a host table of the whole batch."""
        for req_index, tokens in self.rows.items():
            table[req_index] = -1
            table[req_index, : len(tokens)] = tokens
        return table

    def apply(self, sampled: torch.Tensor, transfers: StepTransfers) -> None:
        """Overwrite these rows of a sampler output already on the device."""
        if not self.rows:
            return
        table = np.full((len(self.rows), self.width + 1), -1, dtype=np.int64)
        for k, (req_index, tokens) in enumerate(self.rows.items()):
            table[k, 0] = req_index
            table[k, 1: 1 + len(tokens)] = tokens
        up = transfers.upload("output rows", table, torch.int64)
        sampled[up[:, 0]] = up[:, 1:].to(sampled.dtype)


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


def _sample_rows_without_tree(runner, raw_logprobs: bool, logits: torch.Tensor,
                              spec_decode_metadata, width: int) -> SamplerOutput | None:
    """vLLM's plain Sampler on each request's last row only, or None when vLLM's rejection
    sampler must run instead (processed logprobs, logprobs of chosen ids, thinking budgets).

    For a request without drafts its last row is its only row, so this is exactly plain
    decoding; tree requests' rows are overwritten by tree verification. It avoids running
    the linear rejection sampler (softmax, top-k/top-p sorts) over every tree row. Logprobs
    are gathered afterwards for the whole batch (`verified_logprobs`).
    """
    md = runner.input_batch.sampling_metadata
    holder = md.thinking_budget_state_holder
    if ((md.max_num_logprobs is not None and not raw_logprobs) or md.logprob_token_ids
            or (holder is not None and holder.has_tracked_requests())):
        return None
    runner.input_batch.update_async_output_token_ids()
    last_rows = runner.sampler(logits=logits[spec_decode_metadata.bonus_logits_indices],
                               sampling_metadata=replace(md, max_num_logprobs=None))
    sampled = torch.full((last_rows.sampled_token_ids.shape[0], width), -1,
                         dtype=torch.int32, device=logits.device)
    sampled[:, :1] = last_rows.sampled_token_ids
    return SamplerOutput(sampled, None)


def verified_logprobs(runner, logits: torch.Tensor, sampled: torch.Tensor,
                      cu_sampled: np.ndarray, tree_paths: dict[int, list[int]],
                      transfers: StepTransfers):
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
    rows = logits[transfers.upload("logprob rows", index, torch.int64)].to(torch.float32)
    sampler = runner.sampler
    if sampler.logprobs_mode == "raw_logprobs":
        rows = sampler.compute_logprobs(rows)
    tokens = sampled.reshape(-1).to(torch.int64).clone()
    tokens[tokens < 0] = 0   # placeholders: filtered out by vLLM's parse_output
    return sampler.gather_logprobs(rows, runner.input_batch.sampling_metadata.max_num_logprobs,
                                   tokens)


def sample_with_trees(runner, step: TreeStep, logits: torch.Tensor, spec_decode_metadata,
                      vllm_sample: Callable[[], SamplerOutput], blocker: Callable,
                      raw_logprobs: bool, transfers: StepTransfers
                      ) -> tuple[SamplerOutput, StepVerdicts]:
    """The step's sampler output with every tree verified (or fallen back), and the verdicts.

    vllm_sample: vLLM's own `_sample` for this step (rows that need its rejection sampler);
    blocker(req_id, params): why a request gets no drafts (None: it gets them).
    """
    verdicts = StepVerdicts()
    # Also without trees: the scheduler can cut every draft of a step (token budget,
    # max_model_len), and vLLM's rejection sampler fails on zero draft rows with top-k.
    argmax = greedy_argmax(logits, transfers)
    counts = np.asarray(spec_decode_metadata.num_draft_tokens, dtype=np.int64) + 1
    cu_sampled = np.cumsum(counts)   # vLLM's cu_num_sampled_tokens, known on the host
    width = int(counts.max())
    failed = {req_id: failure.req_index for req_id, failure in step.failed.items()}
    tree_rows = {tree.req_index for tree in step.trees.values()} | set(failed.values())
    untreed_drafts = any(count > 1 and idx not in tree_rows for idx, count in enumerate(counts))
    batch_plain_greedy = not untreed_drafts and all_plain_greedy(runner, blocker)
    output = None
    if not batch_plain_greedy:
        # Rows without a tree need vLLM's sampler; tree rows are overwritten below.
        with _generators_withheld(runner, tree_rows):
            if not untreed_drafts:
                output = _sample_rows_without_tree(runner, raw_logprobs, logits,
                                                   spec_decode_metadata, width)
            if output is None:
                output = vllm_sample()
    generators = _GeneratorStates()
    moves: dict[str, list[tuple[int, int]]] = {}
    for req_id, tree in step.trees.items():
        n = len(tree.layout)
        first = int(cu_sampled[tree.req_index]) - n
        generators.save(runner, req_id)
        try:
            verdict, node_argmax = verify_tree(runner, req_id, tree, logits[first:first + n],
                                               argmax[first:first + n])
        except Exception as error:  # noqa: BLE001 (the proposer logs it; never take the engine down)
            generators.restore(req_id)
            failed[req_id] = tree.req_index
            verdicts.failed[req_id] = Failure(tree.req_index, "verification", error)
            continue
        verdicts.records[req_id] = StepRecord(tree.layout, node_argmax, verdict)
        pairs = [(int(tree.slots[node]), int(tree.slots[k]))
                 for k, node in enumerate(verdict.accepted, start=1)
                 if node != k]   # already in place when the path is the DFS prefix
        if pairs:
            moves[req_id] = pairs
    if moves:
        # [2, M] sources then destinations, each row contiguous (vLLM's CPU writer reads
        # the slots tensor's memory in order)
        pairs = np.ascontiguousarray(np.array(
            [pair for request_pairs in moves.values() for pair in request_pairs],
            dtype=np.int64).T)
        try:
            kv_compaction.compact_accepted_kv(runner, pairs, transfers)
            verdicts.kv_moves = pairs.shape[1]
        except Exception as error:  # noqa: BLE001 (the proposer logs it; never take the engine down)
            # Their accepted nodes' KV may be anywhere now, but only in their own tree
            # slots after x, which committing x's plain token alone leaves rejected.
            for req_id in moves:
                generators.restore(req_id)
                del verdicts.records[req_id]
                failed[req_id] = step.trees[req_id].req_index
                verdicts.failed[req_id] = Failure(failed[req_id], "KV compaction", error)
    rows = _OutputRows(width)
    tree_paths: dict[int, list[int]] = {}   # req_index -> rows of its output tokens
    for req_id, record in verdicts.records.items():
        req_index = step.trees[req_id].req_index
        rows.write(req_index, record.result.tokens)
        tree_paths[req_index] = [0, *record.result.accepted]
    if failed:
        plain = plain_tokens(runner, logits, cu_sampled - counts, sorted(failed.values()),
                             argmax, batch_plain_greedy, transfers)
        for req_index, token in plain.items():
            rows.write(req_index, [token])
            tree_paths[req_index] = [0]
    if batch_plain_greedy:
        # Every row is a plain argmax: vLLM's linear rejection sampler is skipped entirely.
        table = np.full((len(counts), width), -1, dtype=np.int64)
        table[:, 0] = argmax[cu_sampled - 1]   # no-draft requests: the bonus only
        sampled = transfers.upload("output rows", rows.into(table), torch.int32)
        output = SamplerOutput(sampled, None)
    else:
        rows.apply(output.sampled_token_ids, transfers)
    if runner.input_batch.sampling_metadata.max_num_logprobs is not None and raw_logprobs:
        output.logprobs_tensors = verified_logprobs(runner, logits, output.sampled_token_ids,
                                                    cu_sampled, tree_paths, transfers)
    return output, verdicts
