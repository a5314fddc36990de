"""PTD configuration: one frozen dataclass, validated once from user input.

`PTD_CONFIG_KEYS` is the single description of every key (type, allowed range, meaning); it drives
`PTDConfig.from_dict` validation and the README table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

TREE, CHAIN = 0, 1   # the values of draft_shape

# Most draft rows a request may carry: vLLM's linear rejection sampler, which verifies a step
# whose drafts are not PTD's tree (a fallback path), asserts at most 128 (MAX_SPEC_LEN).
MAX_DRAFT_NODES = 128

# key -> (type, min, max, doc). `max` None means unbounded.
PTD_CONFIG_KEYS: dict[str, tuple[type, int, int | None, str]] = {
    "width": (int, 1, 64, "w: most children of a draft-tree node (paper default 4)"),
    "depth": (int, 1, 64, "d: most levels of a draft subtree before stepping (paper default 6)"),
    "num_roots": (int, 1, 64, "R: subtree roots kept in the draft tree (paper default 4)"),
    "pool_cap": (int, 1, 100_000, "soft cap on nodes per draft-pool trie (paper default 60)"),
    "max_nodes": (
        int,
        0,
        MAX_DRAFT_NODES,
        "per-request per-step node budget for C+T, the committed token x not counted",
    ),
    "max_candidate_nodes": (
        int,
        0,
        MAX_DRAFT_NODES,
        (
            "C's share of max_nodes: C takes up to this many nodes first, T the rest; budget "
            "left unused by T goes back to C"
        ),
    ),
    "adaptive_budget": (
        int,
        0,
        1,
        (
            "1: each step drafts none, a quarter, half, three quarters or all of max_nodes, "
            "whichever measured step time and acceptance say gives more tokens/s "
            "(core/budget.py); with chains (draft_shape 1) each request's chain is cut "
            "where a row's predicted acceptance (learned per kind of evidence) no longer pays "
            "for its measured cost, and dropped when the whole chain does not; 0: always "
            "max_nodes"
        ),
    ),
    "draft_shape": (
        int,
        0,
        1,
        (
            "0: tree, each step carries C and the draft tree T (the paper's); 1: chain, "
            "each step carries only C's first path (context match first, then the pool), "
            "no T: a chain attends through the backend's own causal kernel, cheaper than "
            "tree attention where extra rows cost (default on CPU)"
        ),
    ),
    "context_ngram": (
        int,
        0,
        16,
        (
            "longest suffix n-gram looked up in the request's own context for extra candidates "
            "merged into C (0: the paper's pure pool)"
        ),
    ),
    "context_min_ngram": (
        int,
        1,
        16,
        "shortest suffix n-gram that may match when no longer one does (at most context_ngram)",
    ),
    "context_matches": (int, 1, 64, "earlier occurrences of the matched n-gram used"),
    "shared_outputs": (
        int,
        0,
        100_000_000,
        (
            "chains only: tokens of finished requests' outputs kept (newest first) to draft "
            "other requests from, as suffix decoding's global tree (0: off). Outputs are "
            "unchanged either way; set 0 where requests' acceptance rates must not depend "
            "on each other"
        ),
    ),
    "context_depth": (int, 1, 64, "tokens taken after each occurrence"),
    "seed": (int, 0, 2**63 - 1, "seed of the draft-tree seeding RNG (mixed with the prompt)"),
}


@dataclass(frozen=True)
class PTDConfig:
    """Progressive Tree Drafting parameters (defaults: the paper's w=4, d=6, R=4, cap 60)."""

    width: int = 4
    depth: int = 6
    num_roots: int = 4
    pool_cap: int = 60
    max_nodes: int = 64
    max_candidate_nodes: int = 32
    adaptive_budget: int = 1
    draft_shape: int = 0
    context_ngram: int = 4
    context_min_ngram: int = 2
    context_matches: int = 4
    context_depth: int = 8
    shared_outputs: int = 65536
    seed: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            _check(f.name, getattr(self, f.name))
        if self.context_ngram and self.context_min_ngram > self.context_ngram:
            raise ValueError(
                f"PTD config key 'context_min_ngram' must be at most context_ngram "
                f"({self.context_ngram}), got {self.context_min_ngram}"
            )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PTDConfig:
        """Build from a user mapping; any unknown key, wrong type or out-of-range value raises
        ValueError naming the key and what is allowed (nothing is ignored silently)."""
        if not isinstance(d, Mapping):
            # ValueError, not TypeError: the contract is one exception type for all bad input
            raise ValueError(f"PTD config must be a mapping, got {type(d).__name__}")  # noqa: TRY004
        for key in d:
            if key not in PTD_CONFIG_KEYS:
                raise ValueError(
                    f"unknown PTD config key {key!r}; allowed keys: {sorted(PTD_CONFIG_KEYS)}"
                )
        for key, value in d.items():
            _check(key, value)
        return cls(**dict(d))


def _check(key: str, value: Any) -> None:
    typ, lo, hi, _ = PTD_CONFIG_KEYS[key]
    # bool is an int subclass; `width: true` is a user error, not 1.
    if not isinstance(value, typ) or isinstance(value, bool):
        raise ValueError(  # noqa: TRY004 (one exception type for all bad config input)
            f"PTD config key {key!r} must be of type {typ.__name__}, got {type(value).__name__}"
        )
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"PTD config key {key!r} must be in [{lo}, {hi}], got {value}")
