"""The per-request draft pool P: token -> trie of continuations seen after that token.

A trie node is a plain dict `{token: child_dict}` (core/trie.py), children oldest first. Each
trie counts its nodes (the key token itself not counted) and is
capped: after an insertion leaves it over `cap`, its oldest first-level branch is dropped, again
and again until it is within the cap. "Oldest" means least recently touched: an insertion that
passes through a first-level branch moves it to the newest end, so fresh evidence survives. When a
single branch alone exceeds the cap it is cut back to its first `cap` nodes in DFS order, so no
trie ever holds more than `cap` nodes after an insertion returns (the authors' code reached 208).
"""

from __future__ import annotations

from vllm_ptd.core.layout import flatten_trie
from vllm_ptd.core.tree import NO_DRAFT, Node
from vllm_ptd.core.trie import TrieDict, count_nodes


class Trie:
    """One capped trie; `root` holds the first-level branches, oldest first."""

    __slots__ = ("cap", "root", "size")

    def __init__(self, cap: int):
        self.root: TrieDict = {}
        self.size = 0
        self.cap = cap

    def insert(self, node: Node) -> None:
        """Merge `node`'s children subtrees into this trie, with each merged node's draft token
        (when known) as one extra child; `node` itself plays the trie's key."""
        root = self.root
        for c in node.children:
            sub = root.pop(c.token, None)  # pop + re-add: marks the branch as newest
            if sub is None:
                sub = {}
                self.size += 1
            root[c.token] = sub
            self._merge(sub, c)
        d = node.draft
        if d != NO_DRAFT:
            sub = root.pop(d, None)
            if sub is None:
                sub = {}
                self.size += 1
            root[d] = sub
        self._enforce_cap()

    def _merge(self, d: TrieDict, node: Node) -> None:
        stack = [(d, node)]
        while stack:
            d, node = stack.pop()
            for c in node.children:
                sub = d.get(c.token)
                if sub is None:
                    sub = d[c.token] = {}
                    self.size += 1
                if c.children or c.draft != NO_DRAFT:
                    stack.append((sub, c))
            tok = node.draft
            if tok != NO_DRAFT and tok not in d:
                d[tok] = {}
                self.size += 1

    def _enforce_cap(self) -> None:
        root = self.root
        while self.size > self.cap and len(root) > 1:
            oldest = next(iter(root))
            self.size -= 1 + count_nodes(root.pop(oldest))
        if self.size > self.cap:
            self.size = _keep_dfs_prefix(root, self.cap)


def _keep_dfs_prefix(root: TrieDict, keep: int) -> int:
    """Cut `root`'s subtree to its first `keep` nodes in DFS order; returns the nodes kept."""
    kept = 0

    def walk(d: TrieDict) -> None:
        nonlocal kept
        for tok in list(d):
            if kept >= keep:
                del d[tok]
                continue
            kept += 1
            walk(d[tok])

    walk(root)
    return kept


class DraftPool:
    """token -> capped Trie. `flatten` retrieves the candidate tree C for a token."""

    def __init__(self, cap: int):
        self.cap = cap
        self.tries: dict[int, Trie] = {}

    def trie(self, token: int) -> Trie:
        t = self.tries.get(token)
        if t is None:
            t = self.tries[token] = Trie(self.cap)
        return t

    def insert(self, node: Node) -> None:
        """Merge `node`'s subtree (with draft tokens as extra children) into P[node.token]."""
        if node.children or node.draft != NO_DRAFT:
            self.trie(node.token).insert(node)

    def size(self, token: int) -> int:
        t = self.tries.get(token)
        return 0 if t is None else t.size

    def flatten(self, token: int, limit: int) -> tuple[list[int], list[int], list[int]]:
        """C = P[token] as (tokens, parents, depths) for layout rows 1..len; row 0 is the key
        token (x). DFS pre-order with the most recently touched child first, so a DFS prefix
        of length `limit` keeps the freshest branches."""
        t = self.tries.get(token)
        if t is None:
            return [], [], []
        return flatten_trie(t.root, limit, newest_first=True)
