"""Flattening [x; C; T] for one request into arrays a kernel can use cheaply.

Every structure is a tree rooted at x (row 0) given by a parent array in which parents precede
children. The draft tree T joins it through its root "spine": r_0's parent is x and r_k's parent
is r_{k-1}, so the ancestor relation alone yields the paper's visibility (a T node in subtree k
sees r_0..r_{k-1}, its own ancestors and itself; C and T never see each other) and each row's
depth is exactly its position offset p + k + j. Any DFS prefix of the rows is again a valid
layout, which is what budget trimming relies on.

Budget policy (`split_budget`): C (the only part that can be accepted) takes up to
`max_candidate_nodes` rows first; T takes what is left of the budget, up to its size; budget T
leaves unused goes back to C beyond its cap. Both parts are trimmed to DFS prefixes.
"""

from __future__ import annotations

from collections.abc import Callable, Reversible, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from vllm_ptd.core.tree import Node
from vllm_ptd.core.trie import TrieDict

N = TypeVar("N")


@dataclass
class TreeLayout:
    """One request's rows: x, then C in DFS order, then T in DFS order.

    tokens: int64 [n]; tokens[0] = x (the last committed token).
    parents: int32 [n]; parents[0] = -1; parents[i] < i.
    depths: int32 [n]; position offset relative to x; depths[i] = depths[parents[i]] + 1.
    num_candidates: C occupies rows 1..num_candidates, T the rest.
    """

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    num_candidates: int

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_draft(self) -> int:
        """Rows of T."""
        return len(self) - 1 - self.num_candidates

    @property
    def is_chain(self) -> bool:
        """Every row's parent is the row before it: the tree mask is causal, so any causal
        attention kernel computes the tree's attention exactly."""
        return bool(np.array_equal(self.parents[1:], np.arange(len(self) - 1)))

    def ancestor_mask(self) -> np.ndarray:
        """bool [n, n]: row i sees column j iff j is i or an ancestor of i."""
        return ancestor_mask(self.parents)

    def truncate(self, n: int) -> TreeLayout:
        """The first n rows (a DFS prefix, hence a valid tree); n >= 1."""
        if n < 1:
            raise ValueError(f"truncate needs n >= 1, got {n}")
        if n >= len(self):
            return self
        return TreeLayout(
            tokens=self.tokens[:n],
            parents=self.parents[:n],
            depths=self.depths[:n],
            num_candidates=min(self.num_candidates, n - 1),
        )


def split_budget(num_c: int, num_t: int, budget: int, c_cap: int) -> tuple[int, int]:
    """Rows for (C, T) under `budget`: C first up to `c_cap`, T the rest, leftovers back to C."""
    budget = max(0, budget)
    nc = min(num_c, c_cap, budget)
    nt = min(num_t, budget - nc)
    nc = min(num_c, budget - nt)
    return nc, nt


def ancestor_mask(parents: Sequence[int] | np.ndarray) -> np.ndarray:
    """bool [n, n] in-block visibility of a parent array: row i sees column j iff j is i or
    an ancestor of i. parents[0] == -1 and parents[i] is -1 or in [0, i): parents precede
    children, and a -1 past row 0 starts another tree that sees none of the earlier rows.
    The one dense-mask builder: the attention backends, the kernels' reference
    (`kernels.tree_mask.tree_mask_dense`) and the reference driver all use it."""
    p = np.asarray(parents, dtype=np.int64).reshape(-1)
    n = p.size
    if n == 0:
        raise ValueError("a query block needs at least one token (x)")
    if p[0] != -1:
        raise ValueError(f"parents[0] must be -1, got {p[0]}")
    bad = (p >= np.arange(n)) | (p < -1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"parents[{i}] = {p[i]} must be -1 or in [0, {i})")
    mask = np.zeros((n, n), dtype=bool)
    for i, parent in enumerate(p.tolist()):
        if parent >= 0:   # parents precede children: the parent's row is final already
            mask[i] = mask[parent]
        mask[i, i] = True
    return mask


def dfs_rows(roots: Reversible[N], children: Callable[[N], Reversible[N]], limit: int, *,
             last_child_first: bool = False, offset: int = 1, parent: int = 0, depth: int = 1
             ) -> tuple[list[N], list[int], list[int]]:
    """The one depth-first flattener: (nodes, parents, depths) of the forest under `roots` in
    pre-order, at most `limit` rows (a DFS prefix, hence a valid tree).

    `children(node)` gives a node's children (a list, a dict's items); they and the roots are
    visited in that order, or last to first with `last_child_first`. Row i of the result is
    layout row offset + i; parents are layout rows; the roots hang off layout row `parent` at
    `depth`. Runs once per request and step: kept to plain loops.
    """
    nodes: list[N] = []
    parents: list[int] = []
    depths: list[int] = []
    # the stack pops its last entry: what is visited first is pushed last
    stack = [(r, parent, depth) for r in (roots if last_child_first else reversed(roots))]
    pop, push = stack.pop, stack.append
    while stack and len(nodes) < limit:
        node, par, dep = pop()
        idx = offset + len(nodes)
        nodes.append(node)
        parents.append(par)
        depths.append(dep)
        kids = children(node)
        if kids:
            for c in (kids if last_child_first else reversed(kids)):
                push((c, idx, dep + 1))
    return nodes, parents, depths


def flatten_trie(trie: TrieDict, limit: int, newest_first: bool = False
                 ) -> tuple[list[int], list[int], list[int]]:
    """A trie as C rows (tokens, parents, depths) after x (row 0, the trie's key), at most
    `limit` rows. Children first to last (a trie in priority order, core/candidates.py) or,
    `newest_first`, last to first (the pool's tries hold them oldest first: a DFS prefix then
    keeps the freshest branches)."""
    if limit <= 0:
        return [], [], []
    items, parents, depths = dfs_rows(trie.items(), lambda item: item[1].items(), limit,
                                      last_child_first=newest_first)
    return [tok for tok, _ in items], parents, depths


def flatten_draft_tree(
    roots: list[Node], offset: int, limit: int
) -> tuple[list[int], list[int], list[int], list[Node]]:
    """T as rows starting at layout index `offset`, at most `limit` rows (a DFS prefix).

    Returns (tokens, parents, depths, nodes) where nodes[i] is the Node of row offset + i.
    The roots form a spine: r_0 hangs off x, r_k off r_{k-1} (see the module docstring).
    """
    nodes: list[Node] = []
    parents: list[int] = []
    depths: list[int] = []
    spine_parent = 0
    for k, root in enumerate(roots):
        if len(nodes) >= limit:
            break
        root_row = offset + len(nodes)
        sub = dfs_rows([root], lambda n: n.children, limit - len(nodes),
                       offset=root_row, parent=spine_parent, depth=k + 1)
        nodes += sub[0]
        parents += sub[1]
        depths += sub[2]
        spine_parent = root_row
    return [n.token for n in nodes], parents, depths, nodes


def make_layout(
    x: int,
    c_rows: tuple[list[int], list[int], list[int]],
    t_rows: tuple[list[int], list[int], list[int]],
) -> TreeLayout:
    """Assemble [x; C; T] from row lists (parents already absolute layout indices)."""
    ct, cp, cd = c_rows
    tt, tp, td = t_rows
    return TreeLayout(
        tokens=np.array([x, *ct, *tt], dtype=np.int64),
        parents=np.array([-1, *cp, *tp], dtype=np.int32),
        depths=np.array([0, *cd, *td], dtype=np.int32),
        num_candidates=len(ct),
    )
