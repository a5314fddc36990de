"""Wrappers around vLLM 0.32's V1 model runner methods that carry PTD trees through a step.

Per step, the proposer (`runner.drafter`) holds the step's `TreeStep` from input preparation
to sampling:
1. `_update_states`: per-request PTD state is dropped for finished, preempted and resumed
   requests (a resumed request recomputes its KV, so its old layout is void).
2. `_prepare_inputs`: after vLLM's own, the step's trees are built (tree_step.py: tree
   positions, masks) and handed to the proposer (`begin_step`).
3. `_build_attention_metadata`: the step's tree attention rides on each layer's attention
   metadata to PTD's backends.
4. `_sample`: the trees are verified (tree_verification.py), which writes the sampler output
   and moves accepted KV; the verdicts go back to the proposer (`finish_step`).
Every wrapper returns straight to vLLM's function for engines that do not run PTD.
"""

from __future__ import annotations

import logging

from vllm_ptd.attention.tree_metadata import attach_tree
from vllm_ptd.vllm_integration import tree_verification
from vllm_ptd.vllm_integration.tree_step import TreeStep, build_tree_step

logger = logging.getLogger("vllm_ptd")


def ptd_drafter(runner):
    """The runner's PTD proposer, or None when this runner does not run PTD."""
    from vllm_ptd.vllm_integration.proposer import PTDProposer

    drafter = getattr(runner, "drafter", None)
    if not isinstance(drafter, PTDProposer):
        return None
    if drafter.runner is None:
        drafter.attach(runner)
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
        if len(self.input_batch.block_table.block_tables) != 1:
            # Read here, not at start-up: profiling runs before vLLM builds the KV groups.
            raise ValueError("PTD supports models with a single KV cache group only")
        _time_step(drafter, scheduler_output)
        drafter.transfers.start_step()
        result = original(self, scheduler_output, num_scheduled_tokens)
        drafter.step = None
        if scheduler_output.scheduled_spec_decode_tokens:
            drafter.begin_step(build_tree_step(
                self, drafter.pending_layout, drafter.kv_mirrors, drafter.transfers,
                scheduler_output, num_scheduled_tokens))
        return result

    return _prepare_inputs


def _time_step(drafter, scheduler_output) -> None:
    """Tell the proposer's cost model a step starts. Decode rows are one token per request
    plus its drafts; anything more is prompt (prefill or a chunk of it). Without a budget
    policy nothing reads the timing, and no step pays for it."""
    if drafter.policy is None:
        return
    total = scheduler_output.total_num_scheduled_tokens
    spec = scheduler_output.scheduled_spec_decode_tokens
    decode = len(scheduler_output.num_scheduled_tokens) + sum(map(len, spec.values()))
    try:
        drafter.step_started(total, has_prefill=total > decode,
                             drafting=sum(1 for drafts in spec.values() if drafts),
                             requests=frozenset(scheduler_output.num_scheduled_tokens))
    except Exception:  # a lost step-time sample is not worth the engine
        logger.exception("PTD step timing failed")


def make_build_attention_metadata(original):
    def _build_attention_metadata(self, *args, **kwargs):
        drafter = ptd_drafter(self)
        if drafter is None:
            return original(self, *args, **kwargs)
        result = original(self, *args, **kwargs)
        # Every build, so that metadata an engine reuses never keeps an older step's tree;
        # CUDA-graph capture and profiling runs have no step in flight.
        step = drafter.step
        attach_tree(result[0], None if step is None else step.attention)
        return result

    return _build_attention_metadata


def make_sample(original):
    def _sample(self, logits, spec_decode_metadata):
        drafter = ptd_drafter(self)
        if drafter is None:
            return original(self, logits, spec_decode_metadata)
        step = drafter.take_step()
        if spec_decode_metadata is None:
            return original(self, logits, spec_decode_metadata)
        output, verdicts = tree_verification.sample_with_trees(
            self, step or TreeStep(), logits, spec_decode_metadata,
            lambda: original(self, logits, spec_decode_metadata), drafter.blocker,
            drafter.raw_logprobs, drafter.transfers)
        drafter.finish_step(verdicts)
        return output

    return _sample
