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

A repeated prompt: with config `shared_prompt_tail` > 0 each output is indexed after the
last tokens of its prompt, so a request whose prompt ends the same way matches the earlier
answer at its first step, as a long match (the evidence class of a repeated answer), instead
of finding it only once its own first tokens match.

Kept apart per tenant (`TenantSharedOutputs`): requests draft only from the outputs of
requests with the same `cache_salt`, vLLM's per-request isolation key for its prefix cache
(requests without a salt share with each other); the bounds hold over all tenants together.
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
        max_length: as `ContextIndex`'s (how far back a match's length is measured).
    """

    def __init__(self, max_tokens: int, max_n: int, min_n: int = 1, max_length: int = 0):
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        self.max_tokens = max_tokens
        self.max_n = max_n
        self.min_n = min_n
        self.max_length = max(max_length, max_n)
        self.num_outputs = 0   # outputs added, dropped ones included
        self._older = self._index()
        self._newer = self._index()

    def _index(self) -> ContextIndex:
        return ContextIndex(self.max_n, self.min_n, max_length=self.max_length)

    def __len__(self) -> int:
        return len(self._older) + len(self._newer)

    def add(self, output: Sequence[int], lead: Sequence[int] = ()) -> None:
        """Index one finished output, after `lead` (the end of its prompt, so that the same
        prompt finds it); what is longer than half of `max_tokens` keeps its end."""
        if not output:
            return
        half = max(self.max_tokens // 2, 2)
        tokens = [int(t) for t in (*lead, *output)][-(half - 1):]
        if len(self._newer) + len(tokens) + 1 > half:
            self._older, self._newer = self._newer, self._index()
        self._newer.extend(tokens + [SEPARATOR])
        self.num_outputs += 1

    def best_path(self, history: Sequence[int], max_depth: int, max_matches: int
                  ) -> tuple[int, list[int], list[int]]:
        """What followed the longest n-gram ending `history` in earlier outputs:
        (n, tokens, agreeing occurrences), as `ContextIndex.best_path`; the newer index's
        match unless the older one matches a longer n-gram."""
        query = history[-self.max_length:]
        best = (0, [], [])
        for index in (self._newer, self._older):
            if len(index):
                found = index.best_path(max_depth, max_matches, query=query)
                if found[1] and found[0] > best[0]:
                    best = found
        return best


class TenantSharedOutputs:
    """Shared outputs kept apart per tenant: one `SharedOutputs` per `cache_salt` (vLLM's
    per-request prefix-cache isolation key; None, requests without a salt, is a tenant of its
    own), so a request drafts only from the outputs of requests with its own salt.

    Bounded together: at most `max_tokens` tokens over all tenants and at most `max_tenants`
    tenants; when an added output goes over either bound, the tenants that added least
    recently are dropped whole (the one just added to is kept: a single tenant stays within
    `max_tokens` by its own two generations).

    Args:
        max_tokens: most tokens indexed over all tenants (separators included).
        max_n, min_n, max_length: as `SharedOutputs`.
        max_tenants: most salts kept.
    """

    def __init__(self, max_tokens: int, max_n: int, min_n: int = 1, max_tenants: int = 64,
                 max_length: int = 0):
        if max_tokens <= 0 or max_tenants <= 0:
            raise ValueError(f"max_tokens and max_tenants must be positive, got {max_tokens} "
                             f"and {max_tenants}")
        self.max_tokens = max_tokens
        self.max_n = max_n
        self.min_n = min_n
        self.max_tenants = max_tenants
        self.max_length = max_length
        self.num_outputs = 0       # outputs added, over all tenants, dropped ones included
        self.dropped_tenants = 0   # tenants dropped to hold the bounds
        # Oldest first: a tenant moves to the end whenever it adds an output.
        self._tenants: dict[str | None, SharedOutputs] = {}

    def __len__(self) -> int:
        return sum(len(s) for s in self._tenants.values())

    @property
    def num_tenants(self) -> int:
        return len(self._tenants)

    def tenant(self, salt: str | None) -> SharedOutputs | None:
        """The index of this salt's outputs, None while it has none."""
        return self._tenants.get(salt)

    def add(self, salt: str | None, output: Sequence[int], lead: Sequence[int] = ()) -> None:
        """Index one finished output of a request with this salt (after `lead`, as
        `SharedOutputs.add`)."""
        shared = self._tenants.pop(salt, None)
        if shared is None:
            shared = SharedOutputs(self.max_tokens, self.max_n, self.min_n, self.max_length)
        self._tenants[salt] = shared    # newest
        shared.add(output, lead)
        self.num_outputs += 1
        total = len(self)
        while len(self._tenants) > 1 and (total > self.max_tokens
                                          or len(self._tenants) > self.max_tenants):
            oldest = next(iter(self._tenants))
            total -= len(self._tenants.pop(oldest))
            self.dropped_tenants += 1

    def clear(self) -> int:
        """Forget every tenant's outputs (running requests' views stay valid and see none);
        returns how many tenants were dropped."""
        dropped = len(self._tenants)
        self._tenants.clear()
        return dropped

    def best_path(self, salt: str | None, history: Sequence[int], max_depth: int,
                  max_matches: int) -> tuple[int, list[int], list[int]]:
        """`SharedOutputs.best_path` over this salt's outputs only."""
        shared = self._tenants.get(salt)
        return (0, [], []) if shared is None else shared.best_path(history, max_depth,
                                                                   max_matches)

    def view(self, salt: str | None) -> TenantView:
        """What one request drafts from: its own salt's outputs, looked up at each query (so
        a dropped tenant's index is freed at once, not held by running requests)."""
        return TenantView(self, salt)


class TenantView:
    """One tenant's shared outputs, queried like a `SharedOutputs` (`best_path`)."""

    __slots__ = ("outputs", "salt")

    def __init__(self, outputs: TenantSharedOutputs, salt: str | None):
        self.outputs = outputs
        self.salt = salt

    def best_path(self, history: Sequence[int], max_depth: int, max_matches: int
                  ) -> tuple[int, list[int], list[int]]:
        return self.outputs.best_path(self.salt, history, max_depth, max_matches)

    def add(self, output: Sequence[int], lead: Sequence[int] = ()) -> None:
        self.outputs.add(self.salt, output, lead)
