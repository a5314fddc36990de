"""Layout of [x; C; T]: visibility, positions, budget trimming, and request-state plumbing."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_ptd.config import PTDConfig
from vllm_ptd.core.layout import (
    TreeLayout,
    ancestor_mask,
    flatten_draft_tree,
    flatten_trie,
    make_layout,
    split_budget,
)
from vllm_ptd.core.request_state import PTDRequestState
from vllm_ptd.core.tree import Node
from vllm_ptd.core.verify import verify_greedy


def hand_layout() -> TreeLayout:
    # x=100; C: 1[2, 3]; T: roots 10[11[12]], 20, 30[31]
    c_rows = ([1, 2, 3], [0, 1, 1], [1, 2, 2])
    roots = [Node(10, [Node(11, [Node(12)])]), Node(20), Node(30, [Node(31)])]
    tt, tp, td, _ = flatten_draft_tree(roots, offset=4, limit=100)
    return make_layout(100, c_rows, (tt, tp, td))


def test_t_spine_gives_paper_positions_and_visibility():
    lay = hand_layout()
    assert lay.tokens.tolist() == [100, 1, 2, 3, 10, 11, 12, 20, 30, 31]
    assert lay.parents.tolist() == [-1, 0, 1, 1, 0, 4, 5, 4, 7, 8]
    # subtree k, depth j -> offset k + j
    assert lay.depths.tolist() == [0, 1, 2, 2, 1, 2, 3, 2, 3, 4]
    m = lay.ancestor_mask()
    seen = {
        int(lay.tokens[i]): {int(lay.tokens[j]) for j in np.flatnonzero(m[i])} for i in range(10)
    }
    assert seen[31] == {100, 10, 20, 30, 31}  # roots r_0, r_1 only, not 10's descendants
    assert seen[20] == {100, 10, 20}
    assert seen[12] == {100, 10, 11, 12}
    assert seen[3] == {100, 1, 3}


def test_ancestor_mask_of_a_forest_is_self_and_ancestors_only():
    mask = ancestor_mask([-1, 0, 0, 1, -1, 4])
    assert [set(np.flatnonzero(row).tolist()) for row in mask] == [
        {0}, {0, 1}, {0, 2}, {0, 1, 3}, {4}, {4, 5}]


@pytest.mark.parametrize("parents", [[], [0], [-1, 1], [-1, 2, 0], [-1, -2]])
def test_ancestor_mask_refuses_parents_that_do_not_precede_their_children(parents):
    with pytest.raises(ValueError, match="parents|at least one"):
        ancestor_mask(parents)


def test_one_flattener_orders_trie_children_either_way():
    trie = {1: {3: {}, 4: {}}, 2: {5: {}}}   # insertion order: 1 before 2, 3 before 4
    assert flatten_trie(trie, 10) == ([1, 3, 4, 2, 5], [0, 1, 1, 0, 4], [1, 2, 2, 1, 2])
    assert flatten_trie(trie, 10, newest_first=True) == (
        [2, 5, 1, 4, 3], [0, 1, 0, 3, 3], [1, 2, 1, 2, 2])
    assert flatten_trie(trie, 2) == ([1, 3], [0, 1], [1, 2])   # a DFS prefix
    assert flatten_trie(trie, 0) == ([], [], [])


def test_truncate_keeps_a_prefix_and_clips_candidates():
    lay = hand_layout()
    t = lay.truncate(3)
    assert t.tokens.tolist() == [100, 1, 2]
    assert t.num_candidates == 2 and t.num_draft == 0
    assert lay.truncate(6).num_candidates == 3
    with pytest.raises(ValueError):
        lay.truncate(0)


@pytest.mark.parametrize(
    ("num_c", "num_t", "budget", "cap", "expected"),
    [
        (50, 50, 64, 32, (32, 32)),  # C first up to its cap, T the rest
        (10, 50, 64, 32, (10, 50)),  # small C: T may use more
        (50, 5, 64, 32, (50, 5)),  # small T: its unused budget goes back to C
        (50, 50, 20, 32, (20, 0)),  # tight budget: C (the only acceptable part) first
        (0, 0, 64, 32, (0, 0)),
        (5, 5, 0, 32, (0, 0)),
    ],
)
def test_budget_split_policy(num_c, num_t, budget, cap, expected):
    assert split_budget(num_c, num_t, budget, cap) == expected


def run_random_state(
    seed: int, steps: int, config: PTDConfig | None = None, vocab: int = 12
) -> list[TreeLayout]:
    """Drive a request state with random argmax; return every proposed layout."""
    rng = random.Random(seed)
    config = config or PTDConfig()
    stops = frozenset({0})
    state = PTDRequestState(config, [rng.randrange(1, vocab) for _ in range(20)], stops)
    x = rng.randrange(1, vocab)
    layouts = []
    for _ in range(steps):
        lay = state.propose(x, budget=rng.randrange(0, config.max_nodes + 1))
        if rng.random() < 0.3:  # the engine may cut the layout further
            lay = lay.truncate(rng.randrange(1, len(lay) + 1))
        layouts.append(lay)
        # mostly-repetitive argmax so the pool gets hits
        argmax = np.array([(int(t) + 1) % vocab for t in lay.tokens], dtype=np.int64)
        noise = np.array([rng.random() < 0.2 for _ in range(len(lay))])
        argmax[noise] = [rng.randrange(vocab) for _ in range(int(noise.sum()))]
        res = verify_greedy(lay, argmax, stops)
        state.observe(lay, argmax, res)
        x = res.bonus if res.bonus not in stops else rng.randrange(1, vocab)
    return layouts


def check_layout(lay: TreeLayout) -> None:
    n = len(lay)
    parents = lay.parents
    assert parents[0] == -1 and lay.depths[0] == 0
    assert all(0 <= parents[i] < i for i in range(1, n)), "parents precede children"
    assert all(lay.depths[i] == lay.depths[parents[i]] + 1 for i in range(1, n))
    m = lay.ancestor_mask()
    # a node's position offset = the number of tokens it sees after x
    assert (m.sum(1) - 1 == lay.depths).all()
    nc = lay.num_candidates
    c = slice(1, nc + 1)
    t = slice(nc + 1, n)
    assert not m[c, t].any() and not m[t, c].any(), "C and T never see each other"
    assert m[:, 0].all()


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    w=st.integers(1, 4),
    d=st.integers(1, 6),
    r=st.integers(1, 4),
    max_nodes=st.integers(0, 64),
    cand=st.integers(0, 40),
    cut=st.integers(1, 80),
)
def test_layout_invariants_and_trimming_on_random_states(seed, w, d, r, max_nodes, cand, cut):
    cfg = PTDConfig(width=w, depth=d, num_roots=r, max_nodes=max_nodes, max_candidate_nodes=cand)
    for lay in run_random_state(seed, 12, cfg):
        assert len(lay) <= max_nodes + 1
        check_layout(lay)
        check_layout(lay.truncate(min(cut, len(lay))))


def test_pool_gets_hits_and_stats_count_steps():
    layouts = run_random_state(seed=1, steps=30, vocab=6)
    assert any(lay.num_candidates > 0 for lay in layouts)


def test_observe_rejects_a_layout_that_is_not_the_last_proposal():
    state = PTDRequestState(PTDConfig(), [5, 6, 7, 8], frozenset({0}))
    lay = state.propose(5)
    res = verify_greedy(lay, np.ones(len(lay), dtype=np.int64))
    state.observe(lay, np.ones(len(lay), dtype=np.int64), res)
    with pytest.raises(ValueError):
        state.observe(lay, np.ones(len(lay), dtype=np.int64), res)


def test_seeding_is_deterministic_per_prompt_and_seed():
    def roots(prompt, seed):
        s = PTDRequestState(PTDConfig(seed=seed), prompt, frozenset())
        return [repr(r) for r in s.tree.roots]

    prompt = list(range(100, 140))
    assert roots(prompt, 0) == roots(prompt, 0)
    assert any(roots(prompt, 0) != roots(prompt, s) for s in range(1, 6))


def test_observe_feeds_pool_from_t_predictions_and_c_feedback():
    state = PTDRequestState(PTDConfig(), [1, 2, 3], frozenset({0}))
    state.tree.roots = [Node(7, [Node(8)])]
    lay = state.propose(5)
    assert lay.tokens.tolist() == [5, 7, 8]  # pool empty: no C yet
    argmax = np.array([7, 8, 9], dtype=np.int64)
    res = verify_greedy(lay, argmax)
    state.observe(lay, argmax, res)
    assert res.tokens == [7]
    # T snapshot: P[7] = 8 -> 9 (8's draft), feedback: P[5] = 7 (x's argmax)
    assert state.pool.flatten(7, 10)[0] == [8, 9]
    assert state.pool.flatten(5, 10)[0] == [7]
    lay2 = state.propose(7)
    assert lay2.num_candidates == 2 and lay2.tokens[1:3].tolist() == [8, 9]
    argmax2 = np.full(len(lay2), 3, dtype=np.int64)
    argmax2[:3] = [8, 9, 4]
    res2 = verify_greedy(lay2, argmax2)
    assert res2.accepted == [1, 2] and res2.tokens == [8, 9, 4]
    state.observe(lay2, argmax2, res2)
    assert [8, 9, 4] == state.pool.flatten(7, 10)[0][:3]  # verification feedback reached P
    assert state.stats.steps == 2 and state.stats.hits == 1
    assert state.stats.AL == 3.0 and state.stats.DE == 2.0


def test_is_chain() -> None:
    chain = make_layout(7, ([1, 2, 3], [0, 1, 2], [1, 2, 3]), ([], [], []))
    assert chain.is_chain
    assert make_layout(7, ([], [], []), ([], [], [])).is_chain   # x alone
    fork = make_layout(7, ([1, 2, 3], [0, 1, 1], [1, 2, 2]), ([], [], []))
    assert not fork.is_chain
    # A T row hanging off x after C breaks the chain even when C itself is one.
    with_t = make_layout(7, ([1, 2], [0, 1], [1, 2]), ([9], [0], [1]))
    assert not with_t.is_chain
    assert with_t.truncate(3).is_chain
