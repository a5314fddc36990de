"""Tries of tokens as plain dicts, the cheapest structure Python offers for the job.

A trie node is `{token: child_dict}`; dicts keep insertion order, which each owner gives a
meaning: the pool's tries (core/pool.py) hold children oldest first, the context index's
continuations (core/context_index.py) and the merged candidates (core/candidates.py) hold
them in priority order. `layout.flatten_trie` turns either into layout rows.
"""

from __future__ import annotations

TrieDict = dict  # {token: TrieDict}


def count_nodes(d: TrieDict) -> int:
    """Nodes below `d` (d itself not counted)."""
    n = 0
    stack = [d]
    while stack:
        cur = stack.pop()
        n += len(cur)
        stack.extend(cur.values())
    return n
