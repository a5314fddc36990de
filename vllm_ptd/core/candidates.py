"""The candidate tree C of one step: the pool's P[x], optionally merged with context matches.

Priority (the order in which a node budget keeps branches, DFS prefix): context matches first,
most frequent continuation first; then the pool's branches, most recently touched first.
Shared prefixes are merged, so a token both sources predict costs one node.
"""

from __future__ import annotations

from vllm_ptd.core.context_index import TrieDict


def merge_with_pool(primary: TrieDict, pool: dict) -> TrieDict:
    """`primary` (children in priority order) merged with a pool trie (children oldest first)
    into one trie in priority order: primary's children, then the pool's newest first."""
    out: TrieDict = {}
    for tok, sub in primary.items():
        out[tok] = merge_with_pool(sub, pool.get(tok, {}))
    for tok in reversed(pool):
        if tok not in out:
            out[tok] = merge_with_pool({}, pool[tok])
    return out


def flatten_trie(trie: TrieDict, limit: int) -> tuple[list[int], list[int], list[int]]:
    """DFS pre-order rows (tokens, parents, depths) of a trie in priority order, first child
    first, at most `limit` rows; row 0 is the trie's key (x), so parents/depths start at 1."""
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    stack = [(tok, sub, 0, 1) for tok, sub in reversed(trie.items())]
    while stack and len(tokens) < limit:
        tok, sub, par, dep = stack.pop()
        tokens.append(tok)
        parents.append(par)
        depths.append(dep)
        idx = len(tokens)
        for ctok, csub in reversed(sub.items()):
            stack.append((ctok, csub, idx, dep + 1))
    return tokens, parents, depths
