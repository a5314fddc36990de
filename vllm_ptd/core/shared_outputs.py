"""Outputs of finished requests, a drafting source for the requests that follow.

Requests served by one engine resemble each other: the same task's answers share phrasing,
code shares idioms. Suffix decoding keeps a global tree of earlier responses for this reason,
and on the embedded model most of its lead over drafting from a request's own context came
from it (first turns of GSM8K, HumanEval and MBPP, offline replay of greedy outputs). This
is PTD's version: one n-gram index (`ContextIndex`) over the newest finished outputs, queried
with the end of a request's history. Drafts from it are verified like any other, so outputs
are unchanged; only acceptance (speed) depends on what other requests generated.

Bounded: at most `max_tokens` tokens are indexed; beyond that the oldest outputs are
dropped and the index is rebuilt from the rest (half of the bound), so rebuilds are rare
and the memory stays within a few hundred bytes a token.
"""

from __future__ import annotations

from collections import deque
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
        self._outputs: deque[list[int]] = deque()
        self._index = ContextIndex(max_n, min_n)

    def __len__(self) -> int:
        return len(self._index)

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def add(self, output: Sequence[int]) -> None:
        """Index one finished output (anything longer than `max_tokens` keeps its end)."""
        tokens = [int(t) for t in output][-(self.max_tokens - 1):]
        if not tokens:
            return
        self._outputs.append(tokens)
        self._index.extend(tokens + [SEPARATOR])
        if len(self._index) > self.max_tokens:
            self._rebuild(self.max_tokens // 2)

    def _rebuild(self, keep: int) -> None:
        """Drop the oldest outputs until at most `keep` tokens remain; index the rest."""
        total = sum(len(o) + 1 for o in self._outputs)
        while self._outputs and total > keep:
            total -= len(self._outputs.popleft()) + 1
        self._index = ContextIndex(self.max_n, self.min_n)
        for output in self._outputs:
            self._index.extend(output + [SEPARATOR])

    def best_path(self, history: Sequence[int], max_depth: int, max_matches: int
                  ) -> tuple[int, list[int], list[int]]:
        """What followed the longest n-gram ending `history` in earlier outputs:
        (n, tokens, agreeing occurrences), as `ContextIndex.best_path`."""
        if not self._outputs:
            return 0, [], []
        return self._index.best_path(max_depth, max_matches, query=history[-self.max_n:])
