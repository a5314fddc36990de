"""Candidates retrieved from the request's own context (prompt and generated tokens).

PTD's pool only learns from the draft tree; small models, and most chat, code and maths
answers, repeat their own context. `ContextIndex` keeps every n-gram (n <= max_n) of the token
history with the positions where it ended; `continuations` takes the longest n-gram that ends
the history and has occurred before, and returns what followed its most recent occurrences as
a trie, the most frequent continuation first. This is prompt-lookup / suffix-style retrieval,
merged with the pool's candidates by `core.candidates`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from vllm_ptd.core.trie import TrieDict

SEPARATOR = -1   # between the texts of one index (see `extend`)


class ContextIndex:
    """n-gram -> end positions over a growing token history.

    Args:
        max_n: longest n-gram matched (the suffix of the history that is looked up).
        min_n: shortest n-gram that may be used when no longer one matched.
        max_positions: positions kept per n-gram (the most recent).
        max_length: how far back a match of max_n tokens is followed to report its length
            (`best_path`'s n; at most max_length, and never less than max_n).
    """

    def __init__(self, max_n: int, min_n: int = 1, max_positions: int = 16,
                 max_length: int = 0):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.max_n = max_n
        self.min_n = min_n
        self.max_length = max(max_length, max_n)
        self.max_positions = max_positions
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}
        self._segment_start = 0   # first position after the last separator

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens; a negative token is a separator (`SEPARATOR`) that no n-gram or
        continuation crosses."""
        toks = self.tokens
        for tok in tokens:
            toks.append(int(tok))
            end = len(toks) - 1
            if tok < 0:
                self._segment_start = end + 1
                continue
            for n in range(1, min(self.max_n, end - self._segment_start + 1) + 1):
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
        return _by_count(self._match(max_depth, max_matches)[1])

    def best_path(self, max_depth: int, max_matches: int, query: Sequence[int] | None = None
                  ) -> tuple[int, list[int], list[int]]:
        """The first path of `continuations` (the most frequent child at each level, the
        most recent on ties) with its evidence: (n, tokens, counts), n the length of the
        match (0: none; the n-gram's, or for one of max_n tokens as far back as the longest
        of the occurrences used goes on agreeing, up to max_length) and counts[i] how many of
        the occurrences used agree with tokens[:i + 1]. query: look up the end of this token
        sequence instead of the index's own history (another request's, for a shared
        index)."""
        n, used, stop = self._occurrences(max_matches, query)
        toks = self.tokens
        # Walk the occurrences that still agree with the path, most recent first, instead
        # of building their trie: every chain step of every request runs this.
        alive = [end + 1 for end in reversed(used)]   # next position of each occurrence
        tokens: list[int] = []
        agree: list[int] = []
        while len(tokens) < max_depth:
            if len(alive) == 1:   # one occurrence left: its continuation, as far as it goes
                pos = alive[0]
                for tok in toks[pos: min(pos + max_depth - len(tokens), stop)]:
                    if tok < 0:
                        break
                    tokens.append(tok)
                    agree.append(1)
                break
            counts: dict[int, int] = {}
            for pos in alive:
                if pos < stop and toks[pos] >= 0:
                    counts[toks[pos]] = counts.get(toks[pos], 0) + 1
            if not counts:
                break
            tok = max(counts, key=counts.__getitem__)   # first of the most frequent
            tokens.append(tok)
            agree.append(counts[tok])
            alive = [pos + 1 for pos in alive if pos < stop and toks[pos] == tok]
        return n, tokens, agree

    def _occurrences(self, max_matches: int, query: Sequence[int] | None = None
                     ) -> tuple[int, list[int], int]:
        """(n, ends, stop): the longest matching n-gram's length (see `best_path`), the end
        positions of its most recent `max_matches` occurrences (oldest first), and the
        position continuations stop at. (0, [], stop) if none matches."""
        toks = self.tokens
        last = len(toks) - 1
        if query is None:
            query, before = toks, last     # an occurrence must end before the history does
        else:
            before = last + 1
        for n in range(min(self.max_n, len(query)), self.min_n - 1, -1):
            ends = [e for e in self._ends.get(tuple(query[len(query) - n:]), ()) if e < before]
            if ends:
                break
        else:
            return 0, [], last + 1
        used = ends[-max_matches:]
        if n == self.max_n and self.max_length > n:
            n = max(self._match_length(query, end, n) for end in used)
        return n, used, last + 1

    def _match(self, max_depth: int, max_matches: int, query: Sequence[int] | None = None
               ) -> tuple[int, dict]:
        """(n, {token: [count, children]}) for the longest matching n-gram; (0, {}) if none.
        Children are in first-seen order, the most recent occurrence first."""
        n, used, stop = self._occurrences(max_matches, query)
        toks = self.tokens
        counts: dict = {}
        for end in reversed(used):  # most recent first
            node = counts
            for tok in toks[end + 1: min(end + 1 + max_depth, stop)]:
                if tok < 0:
                    break
                entry = node.get(tok)
                if entry is None:
                    entry = node[tok] = [0, {}]
                entry[0] += 1
                node = entry[1]
        return n, counts

    def _match_length(self, query: Sequence[int], end: int, n: int) -> int:
        """How many tokens before `end` (inclusive) agree with the end of `query`, knowing
        the last n do, up to max_length (separators never agree: they are negative)."""
        toks = self.tokens
        limit = min(self.max_length, end + 1, len(query))
        while n < limit and toks[end - n] == query[len(query) - 1 - n]:
            n += 1
        return n


def _by_count(counts: dict) -> TrieDict:
    """{token: [count, children]} -> TrieDict, children sorted by count (stable: recency)."""
    ordered = sorted(counts.items(), key=lambda kv: -kv[1][0])
    return {tok: _by_count(children) for tok, (_, children) in ordered}
