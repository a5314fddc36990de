"""Context n-gram retrieval and its merge with the pool into the candidate tree C."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_ptd.config import PTDConfig
from vllm_ptd.core.candidates import merge_with_pool
from vllm_ptd.core.context_index import ContextIndex
from vllm_ptd.core.layout import flatten_trie
from vllm_ptd.core.request_state import PTDRequestState
from vllm_ptd.core.shared_outputs import SharedOutputs
from vllm_ptd.core.verify import verify_greedy


def test_longest_suffix_match_wins_and_continuations_are_what_followed() -> None:
    idx = ContextIndex(max_n=3, min_n=1)
    # "1 2 3 9" and "5 2 3 7" occurred; the history ends with "1 2 3": the 3-gram matches
    # only the first occurrence, so its continuation (9 ...) is the only candidate.
    idx.extend([1, 2, 3, 9, 8, 5, 2, 3, 7, 6, 1, 2, 3])
    assert idx.continuations(max_depth=2, max_matches=4) == {9: {8: {}}}


def test_shorter_ngram_used_when_no_longer_one_matched_and_counts_order_children() -> None:
    idx = ContextIndex(max_n=3, min_n=1)
    idx.extend([4, 7, 0, 4, 8, 0, 4, 7, 0, 9, 4])
    # Only the unigram "4" has earlier occurrences: followed by 7, 8, 7 -> 7 first (2 votes).
    found = idx.continuations(max_depth=1, max_matches=8)
    assert list(found) == [7, 8]


def test_min_n_refuses_weak_matches() -> None:
    idx = ContextIndex(max_n=3, min_n=2)
    idx.extend([4, 7, 0, 9, 4])
    assert idx.continuations(max_depth=3, max_matches=4) == {}


def test_continuations_never_include_the_current_position_and_stop_at_the_end() -> None:
    idx = ContextIndex(max_n=2, min_n=1)
    idx.extend([3, 3, 3])
    # Earlier "3 3" ended at position 1; what followed is the single 3 at position 2.
    assert idx.continuations(max_depth=5, max_matches=4) == {3: {}}


def test_bad_ngram_range_is_refused() -> None:
    with pytest.raises(ValueError, match="min_n"):
        ContextIndex(max_n=2, min_n=3)


def test_merge_puts_context_first_shares_prefixes_then_pool_newest_first() -> None:
    context = {5: {6: {}}, 9: {}}
    pool = {1: {}, 5: {7: {}}, 2: {}}  # insertion order: oldest first
    merged = merge_with_pool(context, pool)
    assert list(merged) == [5, 9, 2, 1]
    assert list(merged[5]) == [6, 7]
    tokens, parents, depths = flatten_trie(merged, limit=10)
    assert tokens == [5, 6, 7, 9, 2, 1]
    assert parents == [0, 1, 1, 0, 0, 0]
    assert depths == [1, 2, 2, 1, 1, 1]
    assert flatten_trie(merged, limit=3)[0] == [5, 6, 7]


def test_request_state_drafts_a_repeated_phrase_from_its_context() -> None:
    """A phrase seen in the prompt is drafted in C right after its first tokens reappear,
    and greedy verification accepts it when the target repeats it."""
    phrase = [11, 12, 13, 14, 15, 16]
    prompt = [1, 2, *phrase, 3, 4, 11]
    cfg = PTDConfig(context_ngram=4, context_min_ngram=1, max_nodes=16,
                    max_candidate_nodes=12)
    state = PTDRequestState(cfg, prompt, frozenset())
    layout = state.propose(12, committed=[12])  # history ends "... 11 12"
    c_tokens = layout.tokens[1: 1 + layout.num_candidates].tolist()
    assert c_tokens[:4] == [13, 14, 15, 16]
    # Target agrees with the phrase: argmax at x and along the C path continues it.
    argmax = np.zeros(len(layout), dtype=np.int64)
    argmax[0] = 13
    for row, nxt in zip(range(1, 4), [14, 15, 16]):
        argmax[row] = nxt
    argmax[4] = 99  # then it diverges from the prompt: 99 is the bonus
    result = verify_greedy(layout, argmax)
    assert result.tokens == [13, 14, 15, 16, 99]


def test_pure_mode_has_no_context_and_matches_the_pool_order() -> None:
    cfg = PTDConfig(context_ngram=0)
    state = PTDRequestState(cfg, [1, 2, 3, 1, 2], frozenset())
    assert state.context is None
    layout = state.propose(2)
    assert layout.num_candidates == 0


def test_history_must_end_with_x() -> None:
    state = PTDRequestState(PTDConfig(), [1, 2, 3], frozenset())
    with pytest.raises(ValueError, match="not x"):
        state.propose(9, committed=[4])


def test_chain_shape_drafts_only_the_first_path_of_c_and_no_t() -> None:
    """draft_shape "chain": [x; C's first path], capped by the budget; T gets no rows, so the
    layout is a chain (every row's parent the row before)."""
    prompt = [1, 2, 11, 12, 13, 14, 15, 16, 3, 11, 12, 20, 21, 4, 11]
    cfg = PTDConfig(context_ngram=4, context_min_ngram=1, max_nodes=16,
                    max_candidate_nodes=12, draft_shape="chain")
    state = PTDRequestState(cfg, prompt, frozenset())
    assert state.tree.num_nodes() > 0      # T exists; a chain step just does not carry it
    layout = state.propose(12, committed=[12])  # "11 12" was followed by 13... and by 20...
    assert layout.is_chain and layout.num_draft == 0
    assert layout.tokens[1:].tolist() == [20, 21, 4, 11, 12]   # the most recent match
    short = PTDRequestState(cfg, prompt, frozenset()).propose(12, budget=2, committed=[12])
    assert short.tokens.tolist() == [12, 20, 21]
    tree = PTDRequestState(PTDConfig(context_ngram=4, context_min_ngram=1, max_nodes=16,
                                     max_candidate_nodes=12), prompt, frozenset())
    assert not tree.propose(12, committed=[12]).is_chain


def test_chain_shape_learns_from_verification_and_stays_a_chain() -> None:
    cfg = PTDConfig(draft_shape="chain", max_nodes=8)
    state = PTDRequestState(cfg, [5, 6, 7, 8, 9], frozenset())
    x = 9
    for step in range(6):
        layout = state.propose(x)
        assert layout.is_chain and layout.num_draft == 0
        argmax = np.full(len(layout), 5 + step, dtype=np.int64)
        result = verify_greedy(layout, argmax)
        state.observe(layout, argmax, result)
        x = result.bonus


def test_best_path_is_the_first_path_of_the_continuations_with_its_evidence() -> None:
    idx = ContextIndex(max_n=3, min_n=1)
    # "2 3" was followed by "4 5" twice and by "4 6" once (most recently): 4 is agreed by
    # all three occurrences, 5 by two of them.
    idx.extend([2, 3, 4, 5, 0, 2, 3, 4, 5, 1, 2, 3, 4, 6, 9, 2, 3])
    n, tokens, agree = idx.best_path(max_depth=3, max_matches=4)
    assert n == 2 and tokens[:2] == [4, 5] and agree[:2] == [3, 2]
    trie = idx.continuations(max_depth=3, max_matches=4)
    first = []
    while trie:
        tok = next(iter(trie))
        first.append(tok)
        trie = trie[tok]
    assert first == tokens
    assert ContextIndex(max_n=2).best_path(3, 4) == (0, [], [])


def _first_path_with_counts(counts: dict) -> tuple[list[int], list[int]]:
    """The most frequent child at each level of a {token: [count, children]} trie (the
    first on ties, the most recent occurrence's)."""
    tokens, agree = [], []
    while counts:
        tok, (count, counts) = max(counts.items(), key=lambda kv: kv[1][0])
        tokens.append(tok)
        agree.append(count)
    return tokens, agree


@pytest.mark.parametrize("seed", range(4))
def test_best_path_walks_the_occurrences_as_their_trie_would(seed: int) -> None:
    # best_path follows the occurrences that still agree instead of building their trie;
    # on random histories (small vocabularies repeat, separators cut continuations, other
    # indexes are queried) it must give the trie's first path and counts.
    rng = np.random.default_rng(seed)
    for _ in range(30):
        vocab = int(rng.choice([3, 5, 20]))
        max_n = int(rng.choice([1, 2, 4]))
        idx = ContextIndex(max_n, int(rng.integers(1, max_n + 1)),
                           max_length=int(rng.choice([0, 8, 32])))
        for _ in range(int(rng.integers(1, 120))):
            idx.extend([int(rng.integers(vocab)) if rng.random() > 0.03 else -1])
            depth, matches = int(rng.integers(1, 17)), int(rng.integers(1, 7))
            for query in (None, [int(t) for t in rng.integers(vocab, size=int(rng.integers(1, 9)))]):
                n, counts = idx._match(depth, matches, query)
                assert idx.best_path(depth, matches, query) == (n, *_first_path_with_counts(counts))


def test_chain_rows_follow_the_context_then_the_pool_with_an_evidence_class_each() -> None:
    from vllm_ptd.core.chain import (
        CONTEXT,
        NUM_CLASSES,
        POOL,
        SHARED,
        candidate_chains,
        choose_chain,
        match_source,
        row_class,
        rows_from_shared,
    )

    def chain_rows(context, pool_root, limit, context_depth, context_matches, shared=None,
                   value=None):
        # the step's chain, as the request state drafts it
        return choose_chain(*candidate_chains(context, pool_root, limit, context_depth,
                                              context_matches, shared), value)

    idx = ContextIndex(max_n=3, min_n=1)
    idx.extend([2, 3, 4, 7, 0, 2, 3, 4, 5, 1, 2, 3])   # "2 3 4 5" the most recent
    # the pool knows 3 -> 4 -> 5 -> 8 and an older 3 -> 6
    pool_root = {6: {}, 4: {5: {8: {}}}}
    tokens, classes = chain_rows(idx, pool_root, limit=8, context_depth=2, context_matches=4)
    # context: 4 (both occurrences, the pool agrees), 5 (one occurrence, the pool agrees);
    # then the pool's continuation 8
    assert tokens == [4, 5, 8]
    assert classes == [row_class(match_source(CONTEXT, 2, True), 2, 1),
                       row_class(match_source(CONTEXT, 1, True), 2, 2), row_class(POOL, 0, 3)]
    assert rows_from_shared(classes) == 0
    assert chain_rows(idx, pool_root, 2, 2, 4)[0] == [4, 5]
    # no context match: the pool's freshest branch
    assert chain_rows(None, pool_root, 8, 2, 4)[0] == [4, 5, 8]
    assert chain_rows(None, None, 8, 2, 4) == ([], [])
    every = {row_class(s, n, d) for s in range(9) for n in range(1, 20) for d in range(1, 9)}
    # distinct classes: the pool has no n-gram bucket, matches no bucket 0
    assert min(every) == 0 and max(every) == NUM_CLASSES - 1 and len(every) == 4 * (1 + 8 * 5)

    # Other requests' outputs win when they match a longer n-gram: "1 2 3" -> 9 9
    shared = SharedOutputs(max_tokens=64, max_n=3)
    shared.add([7, 1, 2, 3, 9, 9])
    tokens, classes = chain_rows(idx, pool_root, 8, 2, 4, shared)
    assert tokens == [9, 9]
    assert classes[0] == row_class(match_source(SHARED, 1, False), 3, 1)
    assert rows_from_shared(classes) == 2
    # both candidates, as the offline replay's headroom report reads them
    own, other, ngrams = candidate_chains(idx, pool_root, 8, 2, 4, shared)
    assert (own[0], other[0], ngrams) == ([4, 5, 8], [9, 9], (2, 3))
    assert candidate_chains(idx, pool_root, 8, 2, 4)[1] is None
    # with a value (the policy's predicted surplus), the chain worth more wins either way
    assert chain_rows(idx, pool_root, 8, 2, 4, shared, value=len)[0] == [4, 5, 8]
    assert chain_rows(idx, pool_root, 8, 2, 4, shared, value=lambda c: -len(c))[0] == [9, 9]
    # ... and not when the own context matches as long an n-gram
    shorter = SharedOutputs(max_tokens=64, max_n=3)
    shorter.add([8, 2, 3, 6])
    assert chain_rows(idx, pool_root, 8, 2, 4, shorter)[0] == [4, 5, 8]


def test_shared_outputs_stay_bounded_and_never_continue_across_outputs() -> None:
    shared = SharedOutputs(max_tokens=20, max_n=2)
    assert shared.best_path([1, 2], 4, 4) == (0, [], [])
    shared.add([1, 2, 3])
    shared.add([5, 1, 2])          # ends after "1 2": nothing follows it in this output
    n, tokens, agree = shared.best_path([9, 1, 2], 4, 4)
    assert (n, tokens, agree) == (2, [3], [1])
    for k in range(10):
        shared.add([10 + k, 11 + k, 12 + k])
        assert len(shared) <= 20
    assert shared.num_outputs == 12
    assert shared.best_path([9, 1, 2], 4, 4) == (0, [], [])   # the oldest were dropped
    assert shared.best_path([19, 20], 4, 4) == (2, [21], [1])
    with pytest.raises(ValueError, match="max_tokens"):
        SharedOutputs(max_tokens=0, max_n=2)


def test_a_match_is_followed_back_to_report_its_length() -> None:
    # "7 1 2 3 4 5" occurs, then the history ends with "9 1 2 3 4 5": a 2-gram index
    # matches "4 5" and the match goes on agreeing back to "1", not to "7" / "9"
    history = [7, 1, 2, 3, 4, 5, 6, 8, 9, 1, 2, 3, 4, 5]
    short = ContextIndex(max_n=2)
    short.extend(history)
    assert short.best_path(4, 4)[:2] == (2, [6, 8, 9, 1])
    measured = ContextIndex(max_n=2, max_length=16)
    measured.extend(history)
    assert measured.best_path(4, 4)[:2] == (5, [6, 8, 9, 1])
    capped = ContextIndex(max_n=2, max_length=3)
    capped.extend(history)
    assert capped.best_path(4, 4)[0] == 3
    # a shorter n-gram match is not followed back (a longer n-gram would have matched)
    one = ContextIndex(max_n=2, min_n=1, max_length=16)
    one.extend([5, 6, 1, 2, 3, 8, 6])
    assert one.best_path(4, 4)[0] == 1


def test_a_repeated_answer_in_the_shared_outputs_is_a_long_match() -> None:
    answer = list(range(100, 140))
    shared = SharedOutputs(max_tokens=1024, max_n=4, max_length=32)
    shared.add([1, 2, 3])
    shared.add(answer)
    n, tokens, _ = shared.best_path([50, 51] + answer[:20], 8, 4)
    assert n == 20 and tokens == answer[20:28]
    # matches never run across the separator between two outputs
    n, _, _ = shared.best_path([1, 2, 3] + answer[:2], 8, 4)
    assert n == 2


def test_a_repeated_prompt_finds_the_earlier_answer_at_its_first_step() -> None:
    """With the prompt's tail indexed before each output, a request whose prompt ends the
    same way matches the earlier answer before generating anything, as a long match."""
    prompt, answer = list(range(200, 230)), list(range(100, 140))
    plain = SharedOutputs(max_tokens=1024, max_n=4, max_length=32)
    plain.add(answer)
    assert plain.best_path([7] + prompt, 8, 4)[1] == []   # outputs only: nothing to follow
    led = SharedOutputs(max_tokens=1024, max_n=4, max_length=32)
    led.add(answer, lead=prompt[-16:])
    n, tokens, _ = led.best_path([7] + prompt, 8, 4)
    assert n == 16 and tokens == answer[:8]
    # another prompt sharing only its last 3 tokens (a chat template's) is a short match
    n, tokens, _ = led.best_path([1, 2, 3] + prompt[-3:], 8, 4)
    assert n == 3 and tokens == answer[:8]
    led.add([], lead=prompt)   # nothing generated: nothing indexed
    assert led.num_outputs == 1


def test_a_finished_request_indexes_its_prompt_tail_before_its_output() -> None:
    cfg = PTDConfig(draft_shape="chain", shared_prompt_tail=4)
    shared = SharedOutputs(max_tokens=1024, max_n=4, max_length=32)
    prompt = [11, 12, 13, 14, 15, 16]
    state = PTDRequestState(cfg, prompt, frozenset(), shared=shared)
    state.propose(40, committed=[40])
    assert state.prompt_tail(4) == [13, 14, 15, 16] and state.prompt_tail(0) == []
    assert state.prompt_tail(10) == prompt and state.output_tokens() == [40]
    # what the proposer does when the request finishes (vllm_integration/proposer.forget)
    shared.add(state.output_tokens(), state.prompt_tail(cfg.shared_prompt_tail))
    assert shared.best_path([9, 9] + prompt, 8, 4)[:2] == (4, [40])


def _tree_signature(state: PTDRequestState) -> list[tuple[int, int, int]]:
    """T's nodes as (token, draft, children): what a step could have changed."""
    return [(n.token, n.draft, len(n.children)) for n in state.tree.nodes()]


def test_auto_shape_alternates_chains_and_trees_and_t_learns_on_tree_steps_only() -> None:
    """draft_shape "auto": the step's shape is given per call. A chain step leaves T as it
    was (T is keyed by tokens, not positions, so it stays valid for the next tree); a tree
    step writes the target's predictions into T and grows it. Both feed the pool."""
    prompt = [1, 2, 11, 12, 13, 14, 15, 16, 3, 11, 12, 20, 21, 4, 11]
    cfg = PTDConfig(context_ngram=4, context_min_ngram=1, max_nodes=16,
                    max_candidate_nodes=12, draft_shape="auto")
    state = PTDRequestState(cfg, prompt, frozenset())
    assert state.context.max_length == cfg.match_length   # chains measure match lengths
    x, committed = 12, [12]
    for step, shape in enumerate(["chain", "tree", "chain", "chain", "tree", None]):
        before, pool_before = _tree_signature(state), state.pool.size(x)
        layout = state.propose(x, committed=committed, shape=shape)
        assert state.last_shape == (shape or "tree")   # auto without a policy: trees
        if state.last_shape == "chain":
            assert layout.is_chain and layout.num_draft == 0
            assert len(state.chain_classes) == len(layout) - 1
            assert len(layout) > 1 or step > 0
        else:
            assert layout.num_draft > 0 and state.chain_classes == []
        argmax = np.full(len(layout), 30 + step, dtype=np.int64)
        result = verify_greedy(layout, argmax)
        state.observe(layout, argmax, result)
        after = _tree_signature(state)
        assert (after == before) == (state.last_shape == "chain")
        assert state.pool.size(x) >= pool_before
        x, committed = result.bonus, list(result.tokens)


def test_auto_shape_proposals_match_the_fixed_shapes_of_the_same_state() -> None:
    prompt = [1, 2, 11, 12, 13, 14, 15, 16, 3, 11, 12, 20, 21, 4, 11]

    def layout(draft_shape: str, shape: str | None):
        cfg = PTDConfig(context_ngram=4, context_min_ngram=1, max_nodes=16,
                        max_candidate_nodes=12, draft_shape=draft_shape)
        return PTDRequestState(cfg, prompt, frozenset()).propose(12, committed=[12],
                                                                 shape=shape)

    assert layout("auto", "chain").tokens.tolist() == layout("chain", None).tokens.tolist()
    assert layout("auto", "tree").tokens.tolist() == layout("tree", None).tokens.tolist()
