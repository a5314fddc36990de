"""Faults at every stage of PTD's per-step code, in the real engine (embedded model, float32):
each failing request falls back to plain decoding for the rest of its life, exactly, and
the rest of the batch is unaffected.

One PTD engine with small fixed trees and one plain engine for reference. Every test runs the
same mixed batch (plain greedy, greedy with penalties, seeded sampled requests with various
settings) on repetitive prompts, so trees are accepted often, take masked attention and move
KV. Faults come from tests/fault_injection.py (test-only wrappers installed in the worker).
"""

from __future__ import annotations

import gc
from functools import partial

import pytest
from engine_helpers import REPETITIVE_PROMPTS, settled_live_states, snapshot
from fault_injection import clear_faults, fault_counts, inject_faults

pytestmark = pytest.mark.engine

PROMPTS = [*REPETITIVE_PROMPTS, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,"]
SETTINGS = {
    "greedy": {"temperature": 0.0},
    "greedy_penalties": {"temperature": 0.0, "repetition_penalty": 1.2},
    "seeded": {"temperature": 1.0},
    "seeded_top_p_penalties": {"temperature": 0.8, "top_p": 0.9, "presence_penalty": 0.3},
}
NEW_TOKENS = 24
# Small fixed trees (not chains): every step drafts, with masked attention and KV moves.
PTD = {"max_nodes": 8, "max_candidate_nodes": 6, "adaptive_budget": False, "draft_shape": "tree"}


def _requests():
    from vllm import SamplingParams

    out = []
    for s, (name, kw) in enumerate(SETTINGS.items()):
        for p, prompt in enumerate(PROMPTS):
            out.append((f"{name}/{p}", prompt,
                        SamplingParams(max_tokens=NEW_TOKENS, seed=100 * s + p, **kw)))
    return out


def _run(llm) -> dict[str, list[int]]:
    requests = _requests()
    results = llm.generate([p for _, p, _ in requests], [sp for _, _, sp in requests],
                           use_tqdm=False)
    return {name: list(res.outputs[0].token_ids) for (name, _, _), res in zip(requests, results)}


@pytest.fixture(scope="module")
def plain_outputs():
    from vllm_ptd.engine_utils import make_llm

    llm = make_llm(ptd=None, max_num_seqs=32, max_model_len=512)
    try:
        return _run(llm)
    finally:
        del llm
        gc.collect()


@pytest.fixture(scope="module")
def ptd_llm():
    from vllm_ptd.engine_utils import make_llm

    llm = make_llm(ptd=PTD, max_num_seqs=32, max_model_len=512)
    yield llm
    del llm
    gc.collect()


def _faulted_run(llm, faults: dict[str, int]) -> tuple[dict, dict, dict]:
    """Outputs, snapshot delta and the faults that fired, for one batch with `faults`
    (keyed "stage", or "stage:greedy" / "stage:sampled" for faults aimed at those only)."""
    assert llm.collective_rpc(clear_faults) == [True]
    before, fired_before = snapshot(llm), llm.collective_rpc(fault_counts)[0]["fired"]
    for key, count in faults.items():
        stage, _, where = key.partition(":")
        assert llm.collective_rpc(partial(inject_faults, stage=stage, count=count,
                                          where=where or None)) == [True]
    got = _run(llm)
    after, fired_after = snapshot(llm), llm.collective_rpc(fault_counts)[0]["fired"]
    delta = {k: after[k] - before[k] for k in ("fallbacks", "drafted_steps", "kv_moves",
                                               "masked_blocks")}
    fired = {s: fired_after.get(s, 0) - fired_before.get(s, 0) for s in faults}
    return got, delta, fired


def _differ(got, want) -> list[str]:
    return [name for name in want if got[name] != want[name]]


def test_without_faults_the_batch_equals_plain_and_exercises_every_stage(ptd_llm,
                                                                         plain_outputs):
    got, delta, _ = _faulted_run(ptd_llm, {})
    assert _differ(got, plain_outputs) == []
    assert delta["fallbacks"] == 0
    # every stage the faults below target really runs for this batch
    assert delta["drafted_steps"] > 0 and delta["masked_blocks"] > 0 and delta["kv_moves"] > 0


# Per-request stages fail for `count` greedy and `count` sampled requests (seeded: a
# fallback must draw exactly what plain decoding draws); per-step stages ("attention",
# "compaction") for every request with a masked tree / with KV moves in `count` steps.
@pytest.mark.parametrize("stage,count", [("propose", 2), ("layout", 2), ("attention", 2),
                                         ("verify", 3), ("compaction", 2)])
def test_a_fault_at_each_stage_falls_back_to_exactly_plain_decoding(stage, count, ptd_llm,
                                                                    plain_outputs):
    faults = ({f"{stage}:greedy": count, f"{stage}:sampled": count}
              if stage in ("propose", "layout", "verify") else {stage: count})
    got, delta, fired = _faulted_run(ptd_llm, faults)
    assert fired == faults
    assert _differ(got, plain_outputs) == []
    assert delta["fallbacks"] >= sum(faults.values())
    assert delta["drafted_steps"] > 0   # the requests left alone kept drafting
    assert settled_live_states(ptd_llm) == 0


def test_a_failing_fallback_bookkeeping_still_serves_plain_output(ptd_llm, plain_outputs):
    """Dropping the request's state fails inside the fallback itself (after verification and
    setup faults): the request is still blocked and served plainly, its state released when
    it ends."""
    faults = {"verify:sampled": 3, "layout:sampled": 2, "fallback": 4}
    got, delta, fired = _faulted_run(ptd_llm, faults)
    assert fired == faults
    assert _differ(got, plain_outputs) == []
    assert delta["fallbacks"] == 5
    assert settled_live_states(ptd_llm) == 0


def test_faults_at_several_stages_at_once(ptd_llm, plain_outputs):
    # Not "attention": it fails every masked tree of its step, leaving the others no trees.
    faults = {"propose:sampled": 1, "layout:sampled": 1, "verify": 2, "verify:sampled": 2,
              "compaction": 1, "fallback": 2}
    got, delta, fired = _faulted_run(ptd_llm, faults)
    assert _differ(got, plain_outputs) == []
    assert fired == faults
    assert delta["fallbacks"] >= sum(c for s, c in faults.items() if s != "fallback")
    assert settled_live_states(ptd_llm) == 0
