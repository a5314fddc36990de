"""Draft pool P: insertion with drafts, soft cap and eviction order, retrieval order."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_ptd.core.pool import DraftPool, Trie
from vllm_ptd.core.tree import Node
from vllm_ptd.core.trie import count_nodes


def insert_path(trie: Trie, tokens: list[int]) -> None:
    """Insert one token chain below the trie's key, as a chain of draft-tree nodes."""
    chain = None
    for tok in reversed(tokens):
        chain = Node(tok, [] if chain is None else [chain])
    trie.insert(Node(0, [chain]))   # the key node's own token plays no part


def paths(d: dict, prefix=()) -> set[tuple[int, ...]]:
    out = set()
    for tok, sub in d.items():
        out.add((*prefix, tok))
        out |= paths(sub, (*prefix, tok))
    return out


def test_insert_merges_subtree_with_draft_tokens_as_extra_children():
    pool = DraftPool(cap=60)
    pool.insert(Node(1, [Node(2, [Node(3, draft=4)], draft=5)], draft=6))
    trie = pool.tries[1]
    assert paths(trie.root) == {(2,), (2, 3), (2, 3, 4), (2, 5), (6,)}
    assert trie.size == 5 == count_nodes(trie.root)


def test_insert_of_duplicate_content_adds_nothing():
    pool = DraftPool(cap=60)
    n = Node(1, [Node(2)], draft=3)
    pool.insert(n)
    pool.insert(n)
    assert pool.size(1) == 2


def test_node_without_children_or_draft_creates_no_trie():
    pool = DraftPool(cap=60)
    pool.insert(Node(7))
    assert 7 not in pool.tries
    assert pool.flatten(7, 10) == ([], [], [])


def test_cap_evicts_oldest_first_level_branches_until_within_cap():
    trie = Trie(cap=5)
    insert_path(trie, [1, 2])
    insert_path(trie, [3, 4])
    insert_path(trie, [5])
    assert trie.size == 5
    insert_path(trie, [6, 7])  # 7 nodes > 5: drop branch 1 (2 nodes) -> 5
    assert list(trie.root) == [3, 5, 6]
    assert trie.size == 5


def test_touching_a_branch_makes_it_newest():
    trie = Trie(cap=4)
    insert_path(trie, [1, 2])
    insert_path(trie, [3])
    insert_path(trie, [1, 9])  # touches branch 1: now 3 is the oldest
    assert trie.size == 4
    insert_path(trie, [5])
    assert list(trie.root) == [1, 5]
    assert paths(trie.root) == {(1,), (1, 2), (1, 9), (5,)}


def test_single_oversized_branch_is_cut_to_a_dfs_prefix():
    trie = Trie(cap=3)
    insert_path(trie, [1, 2, 3, 4, 5])
    assert trie.size == 3
    assert paths(trie.root) == {(1,), (1, 2), (1, 2, 3)}


@settings(max_examples=80, deadline=None)
@given(cap=st.integers(1, 30), seed=st.integers(0, 10**6))
def test_trie_never_exceeds_cap_and_size_counter_is_exact(cap, seed):
    rng = random.Random(seed)
    pool = DraftPool(cap)
    for _ in range(30):
        node = Node(0, draft=rng.randrange(6))
        frontier = [node]
        for _ in range(rng.randrange(12)):
            parent = rng.choice(frontier)
            child = Node(rng.randrange(6), draft=rng.choice([-1, rng.randrange(6)]))
            parent.children.append(child)
            frontier.append(child)
        pool.insert(node)
        trie = pool.tries[0]
        assert trie.size == count_nodes(trie.root) <= cap


def test_retrieval_is_dfs_with_freshest_branch_first():
    pool = DraftPool(cap=60)
    trie = pool.trie(1)
    insert_path(trie, [2, 3])
    insert_path(trie, [4, 5, 6])
    insert_path(trie, [2, 7])  # branch 2 is now freshest, 7 its newest child
    tokens, parents, depths = pool.flatten(1, 100)
    assert tokens == [2, 7, 3, 4, 5, 6]
    assert parents == [0, 1, 1, 0, 4, 5]
    assert depths == [1, 2, 2, 1, 2, 3]


def test_retrieval_limit_returns_a_dfs_prefix():
    pool = DraftPool(cap=60)
    insert_path(pool.trie(1), [2, 3, 4])
    insert_path(pool.trie(1), [5])
    assert pool.flatten(1, 2) == ([5, 2], [0, 0], [1, 1])
    assert pool.flatten(1, 0) == ([], [], [])
