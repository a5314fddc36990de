"""Shared outputs kept apart per tenant (`cache_salt`): a request drafts only from the
finished outputs of requests with its own salt (requests without one share with each other),
and the token and tenant bounds hold over all tenants together."""

from __future__ import annotations

import pytest

from vllm_ptd.config import CHAIN, PTDConfig
from vllm_ptd.core.chain import rows_from_shared
from vllm_ptd.core.request_state import PTDRequestState
from vllm_ptd.core.shared_outputs import TenantSharedOutputs

ANSWER = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]
PROMPT = [5, 6, 7, 40]   # then x = 41: the start of ANSWER


def test_tenants_see_only_their_own_outputs() -> None:
    shared = TenantSharedOutputs(max_tokens=256, max_n=3)
    shared.add("alice", ANSWER)
    assert shared.best_path("alice", [9, 40, 41], 4, 4)[1] == [42, 43, 44, 45]
    assert shared.best_path("bob", [9, 40, 41], 4, 4) == (0, [], [])
    assert shared.best_path(None, [9, 40, 41], 4, 4) == (0, [], [])   # unsalted: own tenant
    shared.add(None, ANSWER)
    assert shared.best_path(None, [9, 40, 41], 4, 4)[1] == [42, 43, 44, 45]
    assert shared.best_path("", [9, 40, 41], 4, 4) == (0, [], [])     # "" is a salt too
    assert shared.view("bob").best_path([9, 40, 41], 4, 4) == (0, [], [])
    assert shared.num_outputs == 2 and shared.num_tenants == 2


def test_a_repeated_prompt_finds_an_earlier_answer_of_its_own_tenant_only() -> None:
    shared = TenantSharedOutputs(max_tokens=256, max_n=3, max_length=16)
    shared.view("alice").add(ANSWER, lead=PROMPT)   # shared_prompt_tail: prompt, then answer
    assert shared.best_path("alice", [1, *PROMPT], 4, 4)[:2] == (4, ANSWER[:4])
    assert shared.best_path("bob", [1, *PROMPT], 4, 4) == (0, [], [])
    assert shared.best_path(None, [1, *PROMPT], 4, 4) == (0, [], [])


def test_clearing_forgets_every_tenant_and_running_views_see_nothing() -> None:
    shared = TenantSharedOutputs(max_tokens=256, max_n=3)
    view = shared.view("alice")
    shared.add("alice", ANSWER)
    shared.add("bob", ANSWER)
    assert view.best_path([9, 40, 41], 4, 4)[1] == [42, 43, 44, 45]
    assert shared.clear() == 2
    assert len(shared) == 0 and shared.num_tenants == 0
    assert view.best_path([9, 40, 41], 4, 4) == (0, [], [])
    view.add(ANSWER)   # and it fills again
    assert view.best_path([9, 40, 41], 4, 4)[1] == [42, 43, 44, 45]


def _chain_state(shared, salt) -> PTDRequestState:
    config = PTDConfig(draft_shape=CHAIN, context_ngram=3, context_min_ngram=1,
                       shared_outputs=256)
    return PTDRequestState(config, PROMPT, frozenset({0}),
                           shared=None if shared is None else shared.view(salt))


@pytest.mark.parametrize("salt", [None, "alice"])
def test_a_request_drafts_from_its_own_salt_only(salt) -> None:
    shared = TenantSharedOutputs(max_tokens=256, max_n=3)
    # A finished request of tenant `salt` answered ANSWER (through its own view, as
    # PTDProposer.forget adds it).
    shared.view(salt).add(ANSWER)
    for other in ("bob", "alice-2", None if salt is not None else "alice"):
        state = _chain_state(shared, other)
        layout = state.propose(41)
        assert rows_from_shared(state.chain_classes) == 0
        assert 42 not in layout.tokens[1:].tolist()
    state = _chain_state(shared, salt)
    layout = state.propose(41)
    assert layout.tokens[1:4].tolist() == [42, 43, 44]
    assert rows_from_shared(state.chain_classes) >= 3


def test_bounds_hold_over_all_tenants() -> None:
    shared = TenantSharedOutputs(max_tokens=64, max_n=2, max_tenants=5)
    for k in range(200):
        shared.add(f"tenant-{k % 37}", [100 + k, 101 + k, 102 + k, 103 + k])
        assert len(shared) <= 64
        assert shared.num_tenants <= 5
    assert shared.num_outputs == 200
    assert shared.dropped_tenants > 0
    # the newest tenants are kept, the oldest dropped whole
    newest = f"tenant-{199 % 37}"
    assert shared.tenant(newest) is not None
    assert shared.best_path(newest, [299, 300], 2, 4)[1] == [301, 302]
    assert shared.tenant(f"tenant-{(199 - 6) % 37}") is None
    # one tenant alone stays within max_tokens by its own two generations
    for k in range(100):
        shared.add("big", list(range(1000 + 10 * k, 1010 + 10 * k)))
        assert len(shared) <= 64
    assert shared.tenant("big") is not None and shared.num_tenants <= 5
    assert shared.best_path("big", [1990, 1991], 2, 4)[1] == [1992, 1993]
    with pytest.raises(ValueError):
        TenantSharedOutputs(max_tokens=64, max_n=2, max_tenants=0)


@pytest.mark.engine
def test_engine_never_drafts_from_another_salts_outputs() -> None:
    """Real engine (chains, float32): a request repeating an answer that another salt's
    request produced drafts nothing from shared outputs; a repeat with the same salt, or
    two unsalted requests, do. Every output equals plain decoding."""
    import gc

    from engine_helpers import settled_live_states, snapshot
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from vllm_ptd.datasets import sample_prompts
    from vllm_ptd.engine_utils import make_llm
    from vllm_ptd.model import default_model_path

    tok = AutoTokenizer.from_pretrained(default_model_path())
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": sample_prompts("gsm8k", 1)[0]}], tokenize=False,
        add_generation_prompt=True)
    params = SamplingParams(temperature=0.0, max_tokens=64)

    plain = make_llm(ptd=None)
    want = list(plain.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids)
    del plain
    gc.collect()

    llm = make_llm(ptd={"adaptive_budget": False, "draft_shape": "chain"})

    def shared_rows_of(llm, salt: str | None) -> int:
        before = snapshot(llm)["shared_rows"]
        request = {"prompt": prompt} if salt is None else {"prompt": prompt, "cache_salt": salt}
        out = llm.generate([request], params, use_tqdm=False)[0].outputs[0]
        assert list(out.token_ids) == want, salt
        return snapshot(llm)["shared_rows"] - before

    try:
        assert shared_rows_of(llm, "alice") == 0     # nothing finished yet
        assert shared_rows_of(llm, "bob") == 0       # alice's answer is not bob's to draft from
        assert shared_rows_of(llm, None) == 0        # nor an unsalted request's
        assert shared_rows_of(llm, "alice") > 0      # alice's own earlier answer is
        assert shared_rows_of(llm, None) > 0         # unsalted requests share with each other
        assert shared_rows_of(llm, "carol") == 0
        snap = snapshot(llm)
        assert snap["shared_outputs"] == 6 and snap["shared_tenants"] == 4
        assert settled_live_states(llm) == 0
    finally:
        del llm
        gc.collect()
