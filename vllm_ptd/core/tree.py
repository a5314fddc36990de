"""The per-request draft tree T and its growth rules (the paper's expansion, root upkeep,
stepping and width control, plus stop-token pruning).

T is a forest of subtrees ordered by age (oldest first); each subtree's root is a "subtree root"
r_k. Every node keeps its token, its children in insertion order and `draft`, the target's argmax
at that node in the last forward pass that carried it (-1 until it has been carried once).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

NO_DRAFT = -1


class Node:
    """A draft-tree node. `children` is ordered oldest first. `dirty`: the node's own content
    (draft or child list) changed since the pool last saw it; lets the pool skip unchanged
    snapshots instead of re-merging every subtree every step."""

    __slots__ = ("children", "dirty", "draft", "token")

    def __init__(self, token: int, children: list[Node] | None = None, draft: int = NO_DRAFT):
        self.token = token
        self.children: list[Node] = children if children is not None else []
        self.draft = draft
        self.dirty = True

    def child_with(self, token: int) -> Node | None:
        for c in self.children:
            if c.token == token:
                return c
        return None

    def __repr__(self) -> str:  # compact, for test failure messages
        inner = ", ".join(repr(c) for c in self.children)
        return f"{self.token}" + (f"[{inner}]" if inner else "")


def height(node: Node) -> int:
    """Levels on the longest path from `node` down to a leaf (a lone node has height 1)."""
    best = 0
    stack = [(node, 1)]
    while stack:
        n, h = stack.pop()
        best = max(best, h)
        for c in n.children:
            stack.append((c, h + 1))
    return best


def iter_dfs(node: Node) -> Iterator[Node]:
    """Pre-order walk, children oldest first."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


class DraftTree:
    """The draft tree T: `roots` r_0..r_{R-1} oldest first, plus the growth rules.

    `grow` applies, in this order, expansion, root upkeep, stepping, width control and stop-token
    pruning; each rule is also a public method so tests can pin it down alone.
    """

    def __init__(self, width: int, depth: int, num_roots: int, stop_token_ids: frozenset[int]):
        self.width = width
        self.depth = depth
        self.num_roots = num_roots
        self.stop_token_ids = stop_token_ids
        self._roots: list[Node] = []
        self._nodes: list[Node] | None = None  # DFS cache; None after any structural change

    @property
    def roots(self) -> list[Node]:
        return self._roots

    @roots.setter
    def roots(self, value: list[Node]) -> None:
        self._roots = value
        self._nodes = None

    # ---- seeding -------------------------------------------------------------------------
    def seed_from_prompt(self, prompt: Sequence[int], rng: random.Random, n_roots: int = 2) -> None:
        """Paper's seeding: `n_roots` distinct random prompt tokens as roots, each followed by a
        chain of 0 or 1 further random prompt tokens. Stop tokens are never seeded."""
        pool = sorted({t for t in prompt if t not in self.stop_token_ids})
        if not pool:
            return
        for tok in rng.sample(pool, min(n_roots, len(pool))):
            root = Node(tok)
            if rng.randint(1, 2) == 2:
                root.children.append(Node(rng.choice(pool)))
            self.roots.append(root)
        self._nodes = None

    # ---- growth --------------------------------------------------------------------------
    def grow(self, bonus: int) -> None:
        """One step of growth after a forward pass set the nodes' `draft` tokens."""
        self.expand()
        self.upkeep_roots(bonus)
        self.step_depth()
        self.limit_width()
        self.prune_stop_tokens()
        self.nodes()  # rebuild the DFS cache once for propose() and the next observe()

    def expand(self) -> None:
        """Every existing node gets a child with its draft token, unless that child exists or the
        node already has `width` children. A stop-token draft adds nothing: stop pruning would
        remove that child at once."""
        stops = self.stop_token_ids
        for node in self.nodes():  # the list predates this step's new children
            d = node.draft
            if d == NO_DRAFT or len(node.children) >= self.width or d in stops:
                continue
            if node.child_with(d) is None:
                node.children.append(Node(d))
                node.dirty = True
        self._nodes = None

    def upkeep_roots(self, bonus: int) -> None:
        """Keep R roots: drop the oldest while over R; when under R add one root, the newest
        root's draft token (moving that token out of the newest root's children first), or the
        committed bonus token when there is no root at all."""
        while len(self.roots) > self.num_roots:
            self.roots.pop(0)
            self._nodes = None
        if len(self.roots) >= self.num_roots:
            return
        if not self.roots:
            if bonus not in self.stop_token_ids:
                self.roots.append(Node(bonus))
                self._nodes = None
            return
        newest = self.roots[-1]
        tok = newest.draft
        if tok == NO_DRAFT or tok in self.stop_token_ids:
            return
        # The newest root's draft continues the root spine; as a child it would duplicate it.
        if newest.child_with(tok) is not None:
            newest.children = [c for c in newest.children if c.token != tok]
            newest.dirty = True
        self.roots.append(Node(tok))
        self._nodes = None

    def step_depth(self) -> None:
        """A subtree taller than `depth` is replaced by its root's earliest child whose token is
        not another root's token (keeping its descendants); the replacement moves to the end of
        the root order. With no such child the subtree is dropped."""
        changed = True
        while changed:  # one pass suffices after a normal step; loop for arbitrary input trees
            changed = False
            for i, root in enumerate(self.roots):
                if height(root) <= self.depth:
                    continue
                others = {r.token for j, r in enumerate(self.roots) if j != i}
                repl = next((c for c in root.children if c.token not in others), None)
                del self.roots[i]
                if repl is not None:
                    self.roots.append(repl)
                changed = True
                self._nodes = None
                break

    def limit_width(self) -> None:
        """Any node with more than `width` children drops its newest ones."""
        for node in self.nodes():
            if len(node.children) > self.width:
                del node.children[self.width :]
                node.dirty = True
                self._nodes = None

    def prune_stop_tokens(self) -> None:
        """Remove every subtree rooted at a stop token (the tokenizer's EOS / stop ids): nothing
        is ever drafted past the end of a sequence."""
        stops = self.stop_token_ids
        if not stops:
            return
        if any(r.token in stops for r in self.roots):
            self.roots = [r for r in self.roots if r.token not in stops]
            self._nodes = None
        for node in self.nodes():
            if any(c.token in stops for c in node.children):
                node.children = [c for c in node.children if c.token not in stops]
                node.dirty = True
                self._nodes = None

    # ---- views ---------------------------------------------------------------------------
    def num_nodes(self) -> int:
        return len(self.nodes())

    def nodes(self) -> list[Node]:
        """All nodes in layout order: r_0 and its descendants (DFS), then r_1, ...

        Cached: the rules above and the `roots` setter drop the cache whenever they change
        the structure."""
        if self._nodes is None:
            self._nodes = [n for r in self.roots for n in iter_dfs(r)]
        return self._nodes
