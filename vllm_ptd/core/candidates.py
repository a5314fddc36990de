"""The candidate tree C of one step: the pool's P[x], optionally merged with context matches.

Priority (the order in which a node budget keeps branches, DFS prefix): context matches first,
most frequent continuation first; then the pool's branches, most recently touched first.
Shared prefixes are merged, so a token both sources predict costs one node.
"""

from __future__ import annotations

from vllm_ptd.core.trie import TrieDict


def merge_with_pool(primary: TrieDict, pool: TrieDict) -> TrieDict:
    """`primary` (children in priority order) merged with a pool trie (children oldest first)
    into one trie in priority order: primary's children, then the pool's newest first."""
    out: TrieDict = {}
    for tok, sub in primary.items():
        out[tok] = merge_with_pool(sub, pool.get(tok, {}))
    for tok in reversed(pool):
        if tok not in out:
            out[tok] = merge_with_pool({}, pool[tok])
    return out
