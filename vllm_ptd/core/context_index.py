"""Candidates retrieved from the request's own context (prompt and generated tokens).

PTD's pool only learns from the draft tree; small models, and most chat, code and maths
answers, repeat their own context. `ContextIndex` keeps every n-gram (n <= max_n) of the token
history with the positions where it ended; `continuations` takes the longest n-gram that ends
the history and has occurred before, and returns what followed its most recent occurrences as
a trie, the most frequent continuation first. This is prompt-lookup / suffix-style retrieval,
merged with the pool's candidates by `core.candidates`.
"""

from __future__ import annotations

from collections.abc import Iterable

TrieDict = dict  # {token: TrieDict}, children in priority order


class ContextIndex:
    """n-gram -> end positions over a growing token history.

    Args:
        max_n: longest n-gram matched (the suffix of the history that is looked up).
        min_n: shortest n-gram that may be used when no longer one matched.
        max_positions: positions kept per n-gram (the most recent).
    """

    def __init__(self, max_n: int, min_n: int = 1, max_positions: int = 16):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.max_n = max_n
        self.min_n = min_n
        self.max_positions = max_positions
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        toks = self.tokens
        for tok in tokens:
            toks.append(int(tok))
            end = len(toks) - 1
            for n in range(1, min(self.max_n, len(toks)) + 1):
                ends = self._ends.setdefault(tuple(toks[end - n + 1:]), [])
                ends.append(end)
                if len(ends) > self.max_positions:
                    del ends[0]

    def continuations(self, max_depth: int, max_matches: int) -> TrieDict:
        """What followed the longest earlier occurrence(s) of the history's suffix.

        Uses the longest n in [min_n, max_n] with an earlier occurrence, up to `max_matches`
        of its most recent occurrences, each continued by up to `max_depth` tokens. Children
        are ordered by how many occurrences pass through them, most recent first on ties.
        """
        toks = self.tokens
        last = len(toks) - 1
        for n in range(min(self.max_n, len(toks)), self.min_n - 1, -1):
            ends = [e for e in self._ends.get(tuple(toks[last - n + 1:]), ()) if e < last]
            if ends:
                break
        else:
            return {}
        counts: dict = {}
        for end in reversed(ends[-max_matches:]):  # most recent first
            node = counts
            for tok in toks[end + 1: min(end + 1 + max_depth, last + 1)]:
                entry = node.get(tok)
                if entry is None:
                    entry = node[tok] = [0, {}]
                entry[0] += 1
                node = entry[1]
        return _by_count(counts)


def _by_count(counts: dict) -> TrieDict:
    """{token: [count, children]} -> TrieDict, children sorted by count (stable: recency)."""
    ordered = sorted(counts.items(), key=lambda kv: -kv[1][0])
    return {tok: _by_count(children) for tok, (_, children) in ordered}
