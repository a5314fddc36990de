"""Shadow verification (core/shadow.py): rows a chain offered but did not run are checked
against the tokens the request commits next and teach the chain policy's row model."""

from __future__ import annotations

from vllm_ptd.config import PTDConfig
from vllm_ptd.core.budget import BudgetPolicy, RowAcceptanceModel
from vllm_ptd.core.chain import NUM_CLASSES
from vllm_ptd.core.request_state import PTDRequestState
from vllm_ptd.core.shadow import ShadowChain
from vllm_ptd.core.shared_outputs import SharedOutputs


def test_a_declined_chain_settles_at_its_first_row_the_request_did_not_commit() -> None:
    shadow = ShadowChain([5, 6, 7, 8], [10, 11, 12, 13], ran=0)
    assert shadow.feed([5]) is None            # one token a step: still agreeing
    assert shadow.feed([6]) is None
    assert shadow.feed([9, 4]) == ([10, 11, 12, 13], 2)   # rows 1-2 accepted, row 3 rejected


def test_a_shadow_settles_when_every_row_was_committed() -> None:
    shadow = ShadowChain([5, 6], [10, 11], ran=0)
    assert shadow.feed([5, 6, 7]) == ([10, 11], 2)


def test_rows_that_ran_are_left_to_verification() -> None:
    # two rows ran; the request committed both and the shadow learns from the third on
    shadow = ShadowChain([5, 6, 7, 8], [10, 11, 12, 13], ran=2)
    assert shadow.feed([5, 6, 7]) is None
    assert shadow.feed([1]) == ([12, 13], 1)
    # a row that ran was rejected: verification learned it, the rows after it say nothing
    shadow = ShadowChain([5, 6, 7, 8], [10, 11, 12, 13], ran=2)
    assert shadow.feed([5, 9]) == ([], 0)


def _declining_policy() -> BudgetPolicy:
    """A chain policy at a busy batch's prices whose row model learned, in an earlier
    regime, that rows of every class are mostly rejected (first answers' shared matches):
    no chain runs."""
    policy = BudgetPolicy(max_nodes=8, chain=True)
    policy.rows_model = RowAcceptanceModel(NUM_CLASSES, prior=0.2, prior_weight=10.0)
    policy.row_price = policy.chain_price = 0.3   # what choose() sets; fixed here
    return policy


def _rows_run_on_a_repeated_answer() -> list[int]:
    """Rows each step ran while a request repeats an answer that is in the shared outputs
    (greedy: a row is accepted when it equals the answer's token)."""
    answer = list(range(100, 260))
    prompt = list(range(300, 330))
    shared = SharedOutputs(max_tokens=4096, max_n=4, max_length=32)
    shared.add(answer, lead=prompt[-16:])
    cfg = PTDConfig(draft_shape="chain", max_nodes=8, context_ngram=4, context_min_ngram=1)
    policy = _declining_policy()
    state = PTDRequestState(cfg, prompt, frozenset(), shared=shared)
    committed, pos, ran = [answer[0]], 1, []
    while pos < len(answer) - 8:
        layout = state.propose(committed[-1], cfg.max_nodes, committed=committed,
                               chain_policy=policy)
        drafts = layout.tokens[1:].tolist()
        accepted = next((k for k, tok in enumerate(drafts) if tok != answer[pos + k]),
                        len(drafts))
        ran.append(len(drafts))
        policy.record_chain(state.chain_classes if drafts else (), len(drafts), accepted)
        committed = answer[pos:pos + accepted + 1]   # accepted rows and the bonus token
        pos += len(committed)
    return ran


def test_declined_shared_rows_that_the_request_commits_raise_their_class_rate() -> None:
    """A repeated question whose earlier answer sits in the shared outputs: its rows are
    priced out by what their class learned before, yet the request commits them one by
    one; the shadow teaches the row model until the chain runs on its merit."""
    ran = _rows_run_on_a_repeated_answer()
    assert ran[0] == 0, "the first chain should be priced out"
    first = next((i for i, r in enumerate(ran) if r), None)
    assert first is not None and first < 80, ran
    # from then on the chain only grows, rows past each cut still learned by the shadow
    assert all(a <= b for a, b in zip(ran[first:], ran[first + 1:])) and ran[-1] == 8, ran


def test_without_shadows_the_declined_rows_would_stay_declined(monkeypatch) -> None:
    monkeypatch.setattr(ShadowChain, "feed", lambda self, committed: None)   # never settles
    assert max(_rows_run_on_a_repeated_answer()) == 0


def test_without_a_policy_there_is_no_shadow() -> None:
    cfg = PTDConfig(draft_shape="chain", max_nodes=8, context_ngram=4, context_min_ngram=1)
    state = PTDRequestState(cfg, [1, 2, 3, 1, 2, 3, 1, 2], frozenset())
    state.propose(3, committed=[3])
    assert state.shadows == [None, None]
