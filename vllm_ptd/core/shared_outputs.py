"""Outputs of finished requests, a drafting source for the requests that follow.

Requests served by one engine resemble each other: the same task's answers share phrasing,
code shares idioms. Suffix decoding keeps a global tree of earlier responses for this reason,
and on the embedded model most of its lead over drafting from a request's own context came
from it (first turns of GSM8K, HumanEval and MBPP, offline replay of greedy outputs). This
is PTD's version: n-gram indexes (`ContextIndex`) over the newest finished outputs, queried
with the end of a request's history. Drafts from it are verified like any other, so outputs
are unchanged; only acceptance (speed) depends on what other requests generated.

Bounded without stalls: outputs go into the newer of two indexes; when it holds half of
`max_tokens`, the older one is dropped and a new one starts (no rebuild, so no step ever
waits for re-indexing; at most `max_tokens` tokens, ~0.7 KB each, are held). Lookups ask
the newer index first and fall back to the older one.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm_ptd.core.context_index import SEPARATOR, ContextIndex


class SharedOutputs:
    """n-gram index over the newest finished outputs, each ended by a separator.

    Args:
        max_tokens: most tokens indexed (separators included).
        max_n: longest n-gram matched.
        min_n: shortest n-gram that may match.
    """

    def __init__(self, max_tokens: int, max_n: int, min_n: int = 1):
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        self.max_tokens = max_tokens
        self.max_n = max_n
        self.min_n = min_n
        self.num_outputs = 0   # outputs added, dropped ones included
        self._older = ContextIndex(max_n, min_n)
        self._newer = ContextIndex(max_n, min_n)

    def __len__(self) -> int:
        return len(self._older) + len(self._newer)

    def add(self, output: Sequence[int]) -> None:
        """Index one finished output (one longer than half of `max_tokens` keeps its end)."""
        half = max(self.max_tokens // 2, 2)
        tokens = [int(t) for t in output][-(half - 1):]
        if not tokens:
            return
        if len(self._newer) + len(tokens) + 1 > half:
            self._older, self._newer = self._newer, ContextIndex(self.max_n, self.min_n)
        self._newer.extend(tokens + [SEPARATOR])
        self.num_outputs += 1

    def best_path(self, history: Sequence[int], max_depth: int, max_matches: int
                  ) -> tuple[int, list[int], list[int]]:
        """What followed the longest n-gram ending `history` in earlier outputs:
        (n, tokens, agreeing occurrences), as `ContextIndex.best_path`; the newer index's
        match unless the older one matches a longer n-gram."""
        query = history[-self.max_n:]
        best = (0, [], [])
        for index in (self._newer, self._older):
            if len(index):
                found = index.best_path(max_depth, max_matches, query=query)
                if found[1] and found[0] > best[0]:
                    best = found
        return best
