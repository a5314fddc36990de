"""The proposer's step timing (`PTDProposer.step_started`): which intervals between two step
starts become samples of the budget's cost model. Driven on the method alone, with a policy
that records what it is given (no engine)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from vllm_ptd.vllm_integration.proposer import PTDProposer


class RecordingPolicy:
    def __init__(self):
        self.samples = []

    def time_step(self, tokens, seconds, drafting, trees=0, tree_rows=0):
        self.samples.append((tokens, drafting))


def _proposer():
    return SimpleNamespace(_step_mark=None, policy=RecordingPolicy())


def test_steps_that_share_a_request_are_samples_whatever_they_cost():
    p = _proposer()
    PTDProposer.step_started(p, 1, has_prefill=False, drafting=0, requests=frozenset({"a"}))
    time.sleep(0.01)
    PTDProposer.step_started(p, 9, has_prefill=False, drafting=1, requests=frozenset({"a"}))
    PTDProposer.step_started(p, 2, has_prefill=False, drafting=0,
                             requests=frozenset({"a", "b"}))
    assert p.policy.samples == [(1, 0), (9, 1)]


def test_an_interval_between_steps_with_no_request_in_common_is_not_a_sample():
    """At batch 1 the last step of one request and the first of the next: the engine may
    have sat idle between them (a client's turn, another engine's request)."""
    p = _proposer()
    PTDProposer.step_started(p, 5, has_prefill=False, drafting=1, requests=frozenset({"a"}))
    PTDProposer.step_started(p, 1, has_prefill=False, drafting=0, requests=frozenset({"b"}))
    PTDProposer.step_started(p, 1, has_prefill=False, drafting=0, requests=frozenset({"b"}))
    assert p.policy.samples == [(1, 0)]


def test_steps_with_prompt_tokens_are_not_samples():
    p = _proposer()
    PTDProposer.step_started(p, 40, has_prefill=True, drafting=0, requests=frozenset({"a"}))
    PTDProposer.step_started(p, 1, has_prefill=False, drafting=0, requests=frozenset({"a"}))
    PTDProposer.step_started(p, 1, has_prefill=False, drafting=0, requests=frozenset({"a"}))
    assert p.policy.samples == [(1, 0)]


def test_the_runner_times_steps_only_for_a_budget_policy():
    """With the budget off nothing reads step times, so the runner's hook does no work; with
    it on the hook passes the step's decode tokens and drafting requests."""
    from vllm_ptd.vllm_integration.runner_patches import _time_step

    calls = []
    step = SimpleNamespace(total_num_scheduled_tokens=5, num_scheduled_tokens={"a": 4, "b": 1},
                           scheduled_spec_decode_tokens={"a": [7, 8, 9]})
    record = lambda *args, **kwargs: calls.append((args, kwargs))
    _time_step(SimpleNamespace(policy=None, step_started=record), step)
    assert calls == []
    _time_step(SimpleNamespace(policy=RecordingPolicy(), step_started=record), step)
    assert calls == [((5,), {"has_prefill": False, "drafting": 1,
                             "requests": frozenset({"a", "b"})})]
