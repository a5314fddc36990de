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

from dataclasses import dataclass

import numpy as np

from vllm_ptd.core.tree import Node


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
        n = len(self)
        mask = np.zeros((n, n), dtype=bool)
        parents = self.parents
        mask[0, 0] = True
        for i in range(1, n):  # parents precede children, so row parents[i] is final already
            mask[i] = mask[parents[i]]
            mask[i, i] = True
        return mask

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


def flatten_draft_tree(
    roots: list[Node], offset: int, limit: int
) -> tuple[list[int], list[int], list[int], list[Node]]:
    """T as rows starting at layout index `offset`, at most `limit` rows (a DFS prefix).

    Returns (tokens, parents, depths, nodes) where nodes[i] is the Node of row offset + i.
    """
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    nodes: list[Node] = []
    spine_parent, spine_depth = 0, 0  # r_0 hangs off x
    for root in roots:
        if len(nodes) >= limit:
            break
        root_idx = offset + len(nodes)
        stack = [(root, spine_parent, spine_depth + 1)]
        while stack and len(nodes) < limit:
            node, par, dep = stack.pop()
            idx = offset + len(nodes)
            tokens.append(node.token)
            parents.append(par)
            depths.append(dep)
            nodes.append(node)
            for c in reversed(node.children):  # oldest child first in DFS order
                stack.append((c, idx, dep + 1))
        spine_parent, spine_depth = root_idx, spine_depth + 1
    return tokens, parents, depths, nodes


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
