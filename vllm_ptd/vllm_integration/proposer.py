"""PTD's proposer inside vLLM's V1 model runner.

Registered through vLLM's `custom_class` hook (see spec_config.py). Unlike other drafters it
needs more than sampled token ids. It holds the step in flight (`begin_step`, from the
runner's `_prepare_inputs`: the `TreeStep` built from its pending layouts) and takes the
step's verdicts back after sampling (`finish_step`): for every verified request the layout
that was actually run, the target's argmax at every node and the verification result, fed
to the request's `PTDRequestState` before it proposes the next tree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from vllm.logger import init_logger

from vllm_ptd.config import AUTO, CHAIN, TREE
from vllm_ptd.core.budget import BudgetPolicy
from vllm_ptd.core.chain import rows_from_shared
from vllm_ptd.core.layout import TreeLayout
from vllm_ptd.core.metrics import PTDStats
from vllm_ptd.core.request_state import PTDRequestState
from vllm_ptd.core.shared_outputs import TenantSharedOutputs
from vllm_ptd.vllm_integration.cpu_kv_mirror import KVMirrorStore
from vllm_ptd.vllm_integration.eligibility import RAW_LOGPROBS_MODES, draft_blocker
from vllm_ptd.vllm_integration.spec_config import ptd_config_of
from vllm_ptd.vllm_integration.startup_checks import (
    attention_layer_refusals,
    engine_config_refusals,
    model_attention_layers,
    refuse,
    slow_gemm_warning,
)
from vllm_ptd.vllm_integration.step_transfers import StepTransfers
from vllm_ptd.vllm_integration.tree_step import TreeStep
from vllm_ptd.vllm_integration.tree_verification import StepRecord, StepVerdicts

# Under vLLM's "vllm" logger namespace so that vLLM's logging configuration shows it.
logger = init_logger("vllm.ptd")
LOG_INTERVAL_S = 10.0


_UNCHECKED = object()


@dataclass
class RequestEntry:
    """Everything the proposer holds for one request."""

    state: PTDRequestState | None = None
    pending: TreeLayout | None = None    # proposed, not yet verified
    record: StepRecord | None = None     # verified, not yet observed
    # Its last proposal was empty: x then, and whether the step's budget was above zero
    # (the sources had nothing). Its next step commits one token without drafts; it still
    # counts as a PTD step (DE is tokens per step over every step).
    undrafted: tuple[int, bool] | None = None
    blocker: object = _UNCHECKED   # why it gets no drafts (None: it gets them); cached


@dataclass
class StepMark:
    """A step as it started, for the cost model: its period ends when the next one starts."""

    start: float
    tokens: int          # scheduled tokens; -1 when prompt tokens were among them
    drafting: int        # requests with draft rows
    requests: frozenset = frozenset()   # the ids of the requests it scheduled
    trees: int = 0       # of those, requests whose rows needed tree attention
    tree_rows: int = 0   # their rows besides x


@dataclass
class ProposerCounters:
    drafted_steps: int = 0   # request-steps that verified drafts (stats.steps counts all)
    kv_moves: int = 0        # accepted nodes whose KV was moved (path off the DFS prefix)
    masked_blocks: int = 0   # request-steps that needed tree attention (not chains)
    chain_steps: int = 0     # drafted_steps that verified a chain (draft_shape chain or auto)
    tree_steps: int = 0      # drafted_steps that verified a tree (draft_shape tree or auto)
    fallbacks: int = 0       # requests switched to plain decoding after an internal error
    shared_rows: int = 0     # chain rows drafted from other requests' outputs
    budget_sum: int = 0      # the step budget summed over steps with drafting requests
    budget_steps: int = 0
    host_seconds: float = 0.0   # time in propose() (observe + draft), all requests
    # accepted_by_depth[k]: verified request-steps that accepted at least k+1 drafts
    accepted_by_depth: list[int] = field(default_factory=list)


class PTDProposer:
    """One entry per vLLM request, the step in flight, and PTD's counters."""

    def __init__(self, vllm_config) -> None:
        self.config = ptd_config_of(vllm_config.speculative_config)
        if self.config is None:
            raise ValueError("PTDProposer needs a speculative config made from method 'ptd'")
        refuse(engine_config_refusals(vllm_config))
        self.vllm_config = vllm_config
        self.max_model_len = vllm_config.model_config.max_model_len
        # Tree-verified tokens get logprobs of the raw logits only (runner_patches).
        self.raw_logprobs = getattr(vllm_config.model_config, "logprobs_mode",
                                    "raw_logprobs") in RAW_LOGPROBS_MODES
        self.runner = None  # set by `attach` before the first step
        self.transfers: StepTransfers | None = None   # the step's host/device copies
        self.requests: dict[str, RequestEntry] = {}
        self.step: TreeStep | None = None   # the step in flight (prepared, not yet sampled)
        self.stats = PTDStats()
        self.counters = ProposerCounters(accepted_by_depth=[0] * (self.config.max_nodes + 1))
        # Unpacked KV copies for the CPU tree attention (unused on other devices).
        self.kv_mirrors = KVMirrorStore(
            vllm_config.model_config.get_num_layers(vllm_config.parallel_config))
        self._last_log = time.monotonic()
        self._logged = PTDStats()
        # Load-adaptive budget (core/budget.py). Its inputs include wall-clock step times,
        # which differ between ranks: with tensor or pipeline parallelism every rank must
        # build the same trees, so the budget stays fixed there.
        parallel = vllm_config.parallel_config
        self.parallel = (parallel.tensor_parallel_size > 1
                         or parallel.pipeline_parallel_size > 1)
        # Finished requests' outputs, drafted from by the chains of others with the same
        # cache_salt (core/shared_outputs; the salt comes from vllm_integration/tenants.py).
        cfg = self.config
        self.shared: TenantSharedOutputs | None = None
        if cfg.draft_shape != TREE and cfg.shared_outputs > 0 and cfg.context_ngram > 0:
            self.shared = TenantSharedOutputs(cfg.shared_outputs, cfg.context_ngram,
                                              cfg.context_min_ngram,
                                              max_length=cfg.match_length)
        self.policy: BudgetPolicy | None = None
        if self.config.adaptive_budget and not self.parallel:
            self.policy = BudgetPolicy(self.config.max_nodes,
                                       chain=self.config.draft_shape == CHAIN,
                                       auto=self.config.draft_shape == AUTO)
        self.step_budget = self.config.max_nodes   # rows per drafting request, this step
        self._step_mark: StepMark | None = None   # the step in progress

    def attach(self, runner) -> None:
        """The model runner this proposer drafts for (runner_patches, at its first step)."""
        self.runner = runner
        self.transfers = StepTransfers(runner.device)

    def load_model(self, target_model) -> None:
        """PTD drafts with the target itself: there is no draft model to load. Called once
        the target is loaded (before its KV cache exists): the moment to refuse attention
        layers PTD cannot serve exactly, and to say when drafting will barely pay."""
        refuse(attention_layer_refusals(model_attention_layers(self.vllm_config)))
        model_config = getattr(self.vllm_config, "model_config", None)
        warning = slow_gemm_warning(target_model, getattr(model_config, "dtype", None))
        if warning is not None:
            logger.warning(warning)

    # -- lifecycle ---------------------------------------------------------------------
    def forget(self, req_id: str, finished: bool = False) -> None:
        """Drop everything held for a request: all of it when it finished or was aborted
        (its output joins the shared outputs first), all but why it gets no drafts when it
        was preempted or resumed (its KV is recomputed, so its layout and mirror are void)."""
        entry = self.requests.pop(req_id, None)
        self.kv_mirrors.release(req_id)
        if entry is None:
            return
        state = entry.state
        if finished and state is not None and state.shared is not None:
            # its own tenant's outputs, after the end of its prompt
            state.shared.add(state.output_tokens(),
                             state.prompt_tail(state.config.shared_prompt_tail))
        if not finished and entry.blocker is not _UNCHECKED:
            self.requests[req_id] = RequestEntry(blocker=entry.blocker)

    def fall_back(self, req_id: str, stage: str, error: BaseException | None = None) -> None:
        """After an internal error: serve the request by plain decoding until it ends
        (counted in `fallbacks`, logged with the traceback of `error`, else of the exception
        being handled) and drop its PTD state.

        Never raises, since it runs inside the handlers that keep the engine up: counting
        and blocking the request (what keeps it off PTD) cannot fail and come first; logging
        and dropping the state are guarded. State a failed drop leaves behind is released
        when the request ends (`forget` again), and the blocker keeps it from drafting."""
        self.counters.fallbacks += 1
        try:
            logger.error("PTD %s failed for request %s; it continues without drafts",
                         stage, req_id, exc_info=error if error is not None else True)
            self.forget(req_id)
        except Exception:  # noqa: BLE001, S110 (the request is blocked below)
            pass
        finally:
            self.requests[req_id] = RequestEntry(blocker=f"PTD {stage} failed")

    def begin_step(self, step: TreeStep) -> None:
        """The step's trees as prepared (runner `_prepare_inputs`): held until sampling;
        requests whose set-up failed fall back, foreign drafts end their pending layout."""
        self.step = step
        self.counters.masked_blocks += step.masked_blocks
        if self._step_mark is not None:   # marked by step_started just before
            self._step_mark.trees = step.masked_blocks
            self._step_mark.tree_rows = step.masked_rows
        for req_id in step.foreign:
            logger.warning("PTD: scheduled drafts of %s are not its tree; verified linearly "
                           "this step", req_id)
            entry = self.requests.get(req_id)
            if entry is not None:
                entry.pending = None
        for req_id, failure in step.failed.items():
            self.fall_back(req_id, failure.stage, failure.error)

    def take_step(self) -> TreeStep | None:
        """The step in flight, handed to sampling once (None after)."""
        step, self.step = self.step, None
        return step

    def finish_step(self, verdicts: StepVerdicts) -> None:
        """The step's verdicts: records to learn from at the next proposal, fallbacks."""
        self.counters.kv_moves += verdicts.kv_moves
        for req_id, record in verdicts.records.items():
            entry = self.requests.get(req_id)
            if entry is not None:
                entry.record = record
        for req_id, failure in verdicts.failed.items():
            self.fall_back(req_id, failure.stage, failure.error)

    def step_started(self, num_tokens: int, has_prefill: bool, drafting: int,
                     requests: frozenset = frozenset()) -> None:
        """Called as each forward step is prepared (`drafting`: requests with draft rows;
        `requests`: the ids scheduled): the interval since the previous step's start is that
        step's period, a sample of the cost model unless that step carried prompt tokens
        (cheaper per token than draft rows; see core/budget.py) or the engine may have sat
        idle in between. The engine steps without pause while any request runs, so it can
        only have idled when the two steps share no request."""
        now = time.perf_counter()
        mark, self._step_mark = self._step_mark, StepMark(
            now, -1 if has_prefill else num_tokens, drafting, requests)
        if self.policy is None or mark is None or mark.tokens < 0:
            return
        if requests and mark.requests and requests.isdisjoint(mark.requests):
            return
        self.policy.time_step(mark.tokens, now - mark.start, mark.drafting, mark.trees,
                              mark.tree_rows)

    def num_live_states(self) -> int:
        return len(self.requests) + len(self.kv_mirrors)

    def snapshot(self) -> dict:
        """Counters for tests, benchmarks and logs."""
        steps = self.stats.steps
        c = self.counters
        depth = c.accepted_by_depth
        last = max((k for k, v in enumerate(depth) if v), default=-1)
        out = {**self.stats.summary(), "live_states": self.num_live_states(),
               "drafted_steps": c.drafted_steps,
               "chain_steps": c.chain_steps, "tree_steps": c.tree_steps,
               "kv_moves": c.kv_moves, "masked_blocks": c.masked_blocks,
               "shared_rows": c.shared_rows,
               "shared_outputs": 0 if self.shared is None else self.shared.num_outputs,
               "shared_tenants": 0 if self.shared is None else self.shared.num_tenants,
               "fallbacks": c.fallbacks,
               "host_ms_per_step": 1e3 * c.host_seconds / steps if steps else 0.0,
               "accepted_by_depth": depth[: last + 1],
               "transfers": {} if self.transfers is None else vars(self.transfers.counts),
               "mean_budget": (c.budget_sum / c.budget_steps if c.budget_steps
                               else float(self.config.max_nodes))}
        if self.policy is not None:
            out.update(self._policy_snapshot(self.policy))
        return out

    @staticmethod
    def _policy_snapshot(policy: BudgetPolicy) -> dict:
        """The budget policy's fitted costs and what it learned of each shape it drafts."""
        a, b, c = policy.cost.coefficients()
        out: dict = {"cost_model_ms": {"a": 1e3 * a, "b_per_token": 1e3 * b,
                                       "c_per_drafting_request": 1e3 * c}}
        if policy.auto:
            d, e = policy.cost.tree_extras()
            out["cost_model_ms"].update(tree_per_request=1e3 * d, tree_per_row=1e3 * e)
            out["cost_samples"] = {"steps": policy.cost.samples,
                                   "with_trees": policy.cost.tree_samples}
            out["step_shape"] = policy.step_shape
        if policy.chain or policy.auto:
            out["chain_prices"] = {"row": policy.row_price, "chain": policy.chain_price}
            out["accepted_per_chain"] = policy.usage.accepted
        if not policy.chain:
            out["full_budget_gain"] = policy.gain.full_gain
        return out

    def blocker(self, req_id: str, params) -> str | None:
        """Why this request gets no drafts (None: it gets drafts), cached per request:
        sampling params never change mid-request."""
        entry = self.requests.setdefault(req_id, RequestEntry())
        if entry.blocker is _UNCHECKED:
            entry.blocker = draft_blocker(params, self.raw_logprobs)
        return entry.blocker

    def pending_layout(self, req_id: str) -> TreeLayout | None:
        entry = self.requests.get(req_id)
        return None if entry is None else entry.pending

    # -- per step ----------------------------------------------------------------------

    def _shared_view(self, req_state):
        """The shared outputs this request drafts from: its own tenant's (`cache_salt`, put
        on the runner's request state by vllm_integration/tenants.py; None: no salt)."""
        if self.shared is None:
            return None
        return self.shared.view(getattr(req_state, "cache_salt", None))

    def _entry_for(self, req_id: str, req_state) -> RequestEntry:
        entry = self.requests.setdefault(req_id, RequestEntry())
        if entry.state is None:
            stop = set(req_state.sampling_params.all_stop_token_ids or ())
            entry.state = PTDRequestState(self.config, list(req_state.prompt_token_ids or []),
                                          frozenset(stop), shared=self._shared_view(req_state))
        return entry

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        """Return the next draft tokens of every request in the batch (vLLM's contract).

        One list per request, aligned with the runner's input batch: the DFS-flattened
        [C; T] of the request's new tree (x itself is not a draft), or [] for no drafts.
        """
        runner = self.runner
        started = time.perf_counter()
        try:
            self.step_budget = self._choose_budget(runner, sampled_token_ids)
        except Exception:  # never take the engine down
            logger.exception("PTD budget choice failed; no drafts this step")
            self.step_budget = 0   # every request decodes plainly this step
        drafts: list[list[int]] = []
        for index, req_id in enumerate(runner.input_batch.req_ids):
            sampled = sampled_token_ids[index]
            if not sampled:  # partial prefill chunk or discarded: nothing committed
                drafts.append([])
                continue
            req_state = runner.requests[req_id]
            try:
                num_tokens = int(num_tokens_no_spec[index])
                drafts.append(self._propose_one(req_id, req_state, sampled, num_tokens,
                                                token_ids_cpu[index, :num_tokens]))
            except Exception:  # noqa: BLE001 (logged in fall_back; never take the engine down)
                self.fall_back(req_id, "drafting")
                drafts.append([])
        self.counters.host_seconds += time.perf_counter() - started
        try:
            self._maybe_log()
        except Exception:  # a statistics line is not worth the engine
            logger.exception("PTD statistics line failed")
        return drafts

    def _choose_budget(self, runner, sampled_token_ids) -> int:
        """Rows per drafting request for the next step: max_nodes, or the policy's choice
        for this batch (every request of the batch counts one token of step time; those
        that may draft share the budget)."""
        if self.policy is None:
            return self.config.max_nodes
        req_ids = runner.input_batch.req_ids
        drafting = sum(1 for index, req_id in enumerate(req_ids)
                       if sampled_token_ids[index] and req_id in runner.requests
                       and self.blocker(req_id, runner.requests[req_id].sampling_params) is None)
        budget = self.policy.choose(len(req_ids), drafting)
        if drafting:
            self.counters.budget_sum += budget
            self.counters.budget_steps += 1
        return budget

    def _learn(self, state: PTDRequestState, rows: int, accepted: int) -> None:
        """Feed one verified request-step (rows besides x, drafts accepted) to the policy."""
        if self.policy is None:
            return
        if state.last_shape == CHAIN:
            self.policy.record_chain(state.chain_classes, rows, accepted)
        else:
            self.policy.record_tree(rows, accepted, state.stats.steps)

    def _maybe_log(self) -> None:
        """One interval line with the paper's metrics, next to vLLM's own stats lines."""
        now = time.monotonic()
        if now - self._last_log < LOG_INTERVAL_S:
            return
        s, old = self.stats, self._logged
        delta = PTDStats(*(a - b for a, b in zip(vars(s).values(), vars(old).values())))
        if delta.steps:
            logger.info("PTD: DE %.2f, HR %.2f, AL %.2f, C nodes/step %.1f, T nodes/step %.1f "
                        "over %d request-steps; budget %d rows; fallbacks %d", delta.DE,
                        delta.HR, delta.AL, delta.C_per_step, delta.T_per_step, delta.steps,
                        self.step_budget, self.counters.fallbacks)
        self._last_log = now
        self._logged = PTDStats(**vars(s))

    def _propose_one(self, req_id: str, req_state, sampled: list[int], num_tokens: int,
                     history: np.ndarray) -> list[int]:
        """history: the request's prompt and committed tokens, x last (the runner's row)."""
        entry = self._entry_for(req_id, req_state)
        state = entry.state
        record, entry.record = entry.record, None
        undrafted, entry.undrafted = entry.undrafted, None
        entry.pending = None
        if record is not None:
            state.observe(record.layout, record.argmax, record.result)
            layout, result = record.layout, record.result
            self.stats.record(layout.num_candidates, len(layout) - 1 - layout.num_candidates,
                              len(result.accepted), len(result.tokens))
            self.counters.drafted_steps += 1
            if state.last_shape == CHAIN:
                self.counters.chain_steps += 1
            else:
                self.counters.tree_steps += 1
            self._learn(state, len(layout) - 1, len(result.accepted))
            depth = self.counters.accepted_by_depth
            for k in range(min(len(result.accepted), len(depth))):
                depth[k] += 1
        elif undrafted is not None:
            x, sources_empty = undrafted
            state.observe_undrafted(x, sampled)
            self.stats.record(0, 0, 0, len(sampled))
            if sources_empty:
                # Nothing to draft at a budget above zero (no source, or a chain cut to
                # nothing): a step of 0 rows. A step the policy gave no budget says nothing.
                self._learn(state, 0, 0)
        if self.blocker(req_id, req_state.sampling_params) is not None:
            return []
        # One request of the step may draft the shape the policy explores (core/budget.py).
        explore = None if self.policy is None else self.policy.explore
        shape = None if self.policy is None else self.policy.step_shape
        budget = self.step_budget
        if explore is not None:
            shape, budget = explore
        # x sits at position num_tokens - 1; drafts must stay inside max_model_len.
        budget = min(budget, self.max_model_len - num_tokens)
        if budget <= 0:
            entry.undrafted = (sampled[-1], False)
            return []
        # The context index catches up from the runner's own token row, which also covers
        # a resumed request and steps verified outside PTD.
        known = len(state.context) if state.context is not None else num_tokens - 1
        # A budget below max_nodes keeps C's share of it (C alone cannot sustain PTD: T's
        # rows feed the pool that C draws from).
        cap = -(-budget * self.config.max_candidate_nodes // max(self.config.max_nodes, 1))
        layout = state.propose(sampled[-1], budget, committed=history[known:].tolist(),
                               candidate_cap=cap, chain_policy=self.policy, shape=shape)
        if len(layout) <= 1:
            entry.undrafted = (sampled[-1], True)
            return []
        if explore is not None:
            self.policy.explore = None   # explored by this request
        if self.shared is not None:
            self.counters.shared_rows += rows_from_shared(
                state.chain_classes[: len(layout) - 1])
        entry.pending = layout
        return layout.tokens[1:].tolist()
