"""Draft tree T: growth rules on hand-built trees, and invariants under random drafts."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_ptd.core.tree import DraftTree, Node, height, iter_dfs


def tree(width=4, depth=6, roots=4, stops=frozenset()) -> DraftTree:
    return DraftTree(width, depth, roots, frozenset(stops))


def shape(t: DraftTree) -> list[str]:
    return [repr(r) for r in t.roots]


def test_expansion_adds_draft_child_to_every_node():
    t = tree()
    t.roots = [Node(1, [Node(2, draft=3)], draft=5)]
    t.expand()
    assert shape(t) == ["1[2[3], 5]"]


def test_expansion_skips_existing_child_and_full_nodes():
    t = tree(width=2)
    t.roots = [Node(1, [Node(2), Node(3)], draft=9), Node(4, [Node(7)], draft=7)]
    t.expand()
    assert shape(t) == ["1[2, 3]", "4[7]"]


def test_expansion_ignores_nodes_without_prediction():
    t = tree()
    t.roots = [Node(1, [Node(2)])]
    t.expand()
    assert shape(t) == ["1[2]"]


def test_upkeep_drops_oldest_root_when_over_r():
    t = tree(roots=2)
    t.roots = [Node(1), Node(2), Node(3)]
    t.upkeep_roots(bonus=0)
    assert shape(t) == ["2", "3"]


def test_upkeep_adds_newest_roots_draft_and_removes_that_child():
    t = tree(roots=3)
    t.roots = [Node(1), Node(2, [Node(8, [Node(4)]), Node(9)], draft=8)]
    t.upkeep_roots(bonus=0)
    assert shape(t) == ["1", "2[9]", "8"]


def test_upkeep_with_no_roots_uses_bonus_token():
    t = tree()
    t.upkeep_roots(bonus=42)
    assert shape(t) == ["42"]


def test_upkeep_never_roots_a_stop_token():
    t = tree(stops={2})
    t.upkeep_roots(bonus=2)
    assert t.roots == []
    t.roots = [Node(1, draft=2)]
    t.upkeep_roots(bonus=0)
    assert shape(t) == ["1"]


def test_stepping_replaces_tall_subtree_by_earliest_non_colliding_child():
    t = tree(depth=2)
    # 5's first child (7) collides with root 7; the next child (6) takes over and moves last.
    t.roots = [Node(5, [Node(7), Node(6, [Node(8)]), Node(9, [Node(1)])]), Node(7)]
    assert height(t.roots[0]) == 3
    t.step_depth()
    assert shape(t) == ["7", "6[8]"]


def test_stepping_drops_subtree_when_every_child_collides():
    t = tree(depth=1)
    t.roots = [Node(5, [Node(7)]), Node(7)]
    t.step_depth()
    assert shape(t) == ["7"]


def test_stepping_leaves_short_subtrees_alone():
    t = tree(depth=2)
    t.roots = [Node(5, [Node(6)]), Node(7)]
    t.step_depth()
    assert shape(t) == ["5[6]", "7"]


def test_width_control_drops_newest_children():
    t = tree(width=2)
    t.roots = [Node(1, [Node(2), Node(3, [Node(5), Node(6), Node(7)]), Node(4)])]
    t.limit_width()
    assert shape(t) == ["1[2, 3[5, 6]]"]


def test_stop_pruning_removes_subtrees_rooted_at_stop_tokens():
    t = tree(stops={0, 99})
    t.roots = [Node(1, [Node(0, [Node(3)]), Node(4, [Node(99)])]), Node(99, [Node(5)])]
    t.prune_stop_tokens()
    assert shape(t) == ["1[4]"]


def test_grow_applies_rules_in_order():
    t = tree(width=4, depth=2, roots=2)
    t.roots = [Node(1, [Node(2, draft=3)], draft=2)]
    # expansion gives 2 the child 3; upkeep then removes 1's child 2 (and 3 with it) and adds
    # a fresh root 2 from 1's draft, so no subtree is too tall for stepping.
    t.grow(bonus=0)
    assert shape(t) == ["1", "2"]
    t.roots[0].draft, t.roots[1].draft = 4, 5
    t.grow(bonus=0)
    assert shape(t) == ["1[4]", "2[5]"]
    t.roots[0].children[0].draft = 6
    t.grow(bonus=0)  # 1[4[6]] has height 3 > 2: replaced by 4[6], moved last
    assert shape(t) == ["2[5]", "4[6]"]


def test_seeding_uses_distinct_prompt_tokens_and_short_chains():
    prompt = [10, 11, 12, 13, 14, 2]
    for s in range(20):
        t = tree(stops={2})
        t.seed_from_prompt(prompt, random.Random(s))
        assert len(t.roots) == 2
        assert len({r.token for r in t.roots}) == 2
        for r in t.roots:
            assert height(r) <= 2
            for n in iter_dfs(r):
                assert n.token in prompt and n.token != 2


@settings(max_examples=60, deadline=None)
@given(
    w=st.integers(1, 4),
    d=st.integers(1, 6),
    r=st.integers(1, 4),
    seed=st.integers(0, 10**6),
    steps=st.integers(1, 40),
)
def test_invariants_hold_after_every_growth_step(w, d, r, seed, steps):
    rng = random.Random(seed)
    stops = frozenset({0})
    t = DraftTree(w, d, r, stops)
    t.seed_from_prompt([rng.randrange(8) for _ in range(10)], rng)
    for _ in range(steps):
        for n in t.nodes():
            n.draft = rng.randrange(8)  # vocab 0..7, 0 is a stop token
        t.grow(bonus=rng.randrange(1, 8))
        assert len(t.roots) <= r
        for root in t.roots:
            assert height(root) <= d
            for n in iter_dfs(root):
                assert len(n.children) <= w
                assert n.token not in stops
                kids = [c.token for c in n.children]
                assert len(kids) == len(set(kids))
