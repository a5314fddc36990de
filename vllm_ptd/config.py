"""PTD configuration: one frozen dataclass, validated once from user input.

`PTD_CONFIG_KEYS` is the single description of every key (type, what it allows, meaning): it
drives `PTDConfig` validation and the key table of the README (`python -m vllm_ptd.config`
prints it). `CPU_DEFAULTS` are the keys whose default differs on CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

# The values of draft_shape.
TREE, CHAIN, AUTO = "tree", "chain", "auto"

# Most draft rows a request may carry: vLLM's linear rejection sampler, which verifies a step
# whose drafts are not PTD's tree (a fallback path), asserts at most 128 (MAX_SPEC_LEN).
MAX_DRAFT_NODES = 128


@dataclass(frozen=True)
class ConfigKey:
    """One PTD config key.

    kind: int, bool or str. int keys allow [lo, hi]; str keys allow `choices`; bool keys allow
    true and false. `old` maps the integer spellings an enumeration had before it took names
    (draft_shape 0 / 1, adaptive_budget 0 / 1) to their values, so existing configs still work.
    """

    kind: type
    doc: str
    lo: int = 0
    hi: int = 0
    choices: tuple[str, ...] = ()
    old: Mapping[int, Any] = field(default_factory=dict)

    def allowed(self) -> str:
        """What the key accepts, as the README table and the error messages say it."""
        if self.kind is int:
            hi = f"2^{self.hi.bit_length()}-1" if self.hi >= 2**32 else str(self.hi)
            return f"{self.lo}-{hi}"
        names = ", ".join(self.choices) if self.kind is str else "true, false"
        if self.old:
            names += " (old: " + ", ".join(f"{k} = {_shown(v)}" for k, v in self.old.items()) + ")"
        return names

    def check(self, key: str, value: Any) -> Any:
        """`value` as the config holds it (an old spelling mapped to its name); ValueError,
        naming the key and what it allows, for anything else."""
        if self.kind is int:
            # bool is an int subclass; `width: true` is a user error, not 1.
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(
                    f"PTD config key {key!r} must be of type int, got {type(value).__name__}")
            if not self.lo <= value <= self.hi:
                raise ValueError(
                    f"PTD config key {key!r} must be in [{self.lo}, {self.hi}], got {value}")
            return value
        if self.kind is bool and isinstance(value, bool):
            return value
        if self.kind is str and isinstance(value, str) and value in self.choices:
            return value
        if type(value) is int and value in self.old:   # exactly int: True is not 1 here
            return self.old[value]
        shown = ("'" + "', '".join(self.choices) + "'") if self.kind is str else "true or false"
        old = f" (or the old {', '.join(map(str, self.old))})" if self.old else ""
        raise ValueError(f"PTD config key {key!r} must be {'one of ' * (self.kind is str)}"
                         f"{shown}{old}, got {value!r}")


def _int(lo: int, hi: int, doc: str) -> ConfigKey:
    return ConfigKey(int, doc, lo=lo, hi=hi)


PTD_CONFIG_KEYS: dict[str, ConfigKey] = {
    "width": _int(1, 64, "w: most children of a draft-tree node (paper default 4)"),
    "depth": _int(1, 64, "d: most levels of a draft subtree before stepping (paper default 6)"),
    "num_roots": _int(1, 64, "R: subtree roots kept in the draft tree (paper default 4)"),
    "pool_cap": _int(1, 100_000, "soft cap on nodes per draft-pool trie (paper default 60)"),
    "max_nodes": _int(0, MAX_DRAFT_NODES,
                      "per-request per-step node budget for C+T, the committed token x not "
                      "counted"),
    "max_candidate_nodes": _int(0, MAX_DRAFT_NODES,
                                "C's share of max_nodes: C takes up to this many nodes first, "
                                "T the rest; budget left unused by T goes back to C"),
    "adaptive_budget": ConfigKey(
        bool,
        "true: each step drafts none, a quarter, half, three quarters or all of max_nodes, "
        "whichever measured step time and acceptance say gives more tokens/s "
        "(core/budget.py); with chains each request's chain is cut where a row's predicted "
        "acceptance (learned per kind of evidence) no longer pays for its measured cost, and "
        "dropped when the whole chain does not; false: always max_nodes",
        old={0: False, 1: True},
    ),
    "draft_shape": ConfigKey(
        str,
        "tree: each step carries C and the draft tree T (the paper's); chain: each step "
        "carries only C's first path (context match first, then the pool), no T: a chain "
        "attends through the backend's own causal kernel, cheaper than tree attention where "
        "extra rows cost; auto: each step the adaptive budget chooses chains or trees (and "
        "their size) for the whole batch from each shape's measured acceptance and step "
        "cost, trying the other shape now and then (core/budget.py; T grows on tree steps "
        "only; without adaptive_budget, trees)",
        choices=(TREE, CHAIN, AUTO),
        old={0: TREE, 1: CHAIN},
    ),
    "context_ngram": _int(0, 16,
                          "longest suffix n-gram looked up in the request's own context for "
                          "extra candidates merged into C (0: the paper's pure pool)"),
    "context_min_ngram": _int(1, 16,
                              "shortest suffix n-gram that may match when no longer one does "
                              "(at most context_ngram)"),
    "context_matches": _int(1, 64, "earlier occurrences of the matched n-gram used"),
    "shared_outputs": _int(0, 100_000_000,
                           "chains only (draft_shape chain, and auto's chain steps): tokens "
                           "of finished requests' outputs kept (newest first) to draft other "
                           "requests from, as suffix decoding's global tree (0: off). Outputs "
                           "are unchanged either way; set 0 where requests' acceptance rates "
                           "must not depend on each other"),
    "shared_prompt_tail": _int(0, 64,
                               "shared outputs: the last tokens of each finished request's "
                               "prompt indexed before its output, so a request whose prompt "
                               "ends the same way (a repeated question) matches the earlier "
                               "answer from its first step on (0: outputs only)"),
    "context_depth": _int(1, 64, "tokens taken after each occurrence"),
    "match_length": _int(0, 64,
                         "chains: how far back a match of context_ngram tokens is followed to "
                         "measure its length, the evidence by which a row's acceptance is "
                         "learned (a long match, such as a repeated answer, runs long chains "
                         "at any load); 0: the n-gram's length only"),
    "seed": _int(0, 2**63 - 1, "seed of the draft-tree seeding RNG (mixed with the prompt)"),
}

# Defaults on CPU, where they differ from the dataclass's (which suit GPUs: there a step with
# the paper's ~64 extra tokens is nearly free at small batch). x and 15 nodes fill one 16-row
# tile of oneDNN's AMX GEMMs (from 17 rows on a second tile costs ~20% more), and 15 nodes
# (10 for C) beat 12 (8) on MT-Bench first turns, GSM8K and HumanEval and tied on MBPP (bf16,
# batch 1, SmolLM2-135M). With 1-gram matches and 16 tokens per occurrence more chains draft;
# the row prices cut what does not pay (offline replay of greedy first turns,
# benchmarks/replay_drafting.py). The draft's shape is no platform default: "auto" measures
# (on the AMX CPU it drafts chains, a tree step costing ~1.8x a chain step).
CPU_DEFAULTS: dict[str, Any] = {"max_nodes": 15, "max_candidate_nodes": 10,
                                "context_min_ngram": 1, "context_depth": 16}


@dataclass(frozen=True)
class PTDConfig:
    """Progressive Tree Drafting parameters (defaults: the paper's w=4, d=6, R=4, cap 60)."""

    width: int = 4
    depth: int = 6
    num_roots: int = 4
    pool_cap: int = 60
    max_nodes: int = 64
    max_candidate_nodes: int = 32
    adaptive_budget: bool = True
    draft_shape: str = AUTO
    context_ngram: int = 4
    context_min_ngram: int = 2
    context_matches: int = 4
    context_depth: int = 8
    match_length: int = 32
    shared_outputs: int = 65536
    shared_prompt_tail: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            # frozen: the checked value (an old spelling mapped to its name) is set this way
            object.__setattr__(self, f.name, PTD_CONFIG_KEYS[f.name].check(
                f.name, getattr(self, f.name)))
        if self.context_ngram and self.context_min_ngram > self.context_ngram:
            raise ValueError(
                f"PTD config key 'context_min_ngram' must be at most context_ngram "
                f"({self.context_ngram}), got {self.context_min_ngram}"
            )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PTDConfig:
        """Build from a user mapping; any unknown key, wrong type or value not allowed raises
        ValueError naming the key and what is allowed (nothing is ignored silently)."""
        if not isinstance(d, Mapping):
            # ValueError, not TypeError: the contract is one exception type for all bad input
            raise ValueError(f"PTD config must be a mapping, got {type(d).__name__}")  # noqa: TRY004
        for key in d:
            if key not in PTD_CONFIG_KEYS:
                raise ValueError(
                    f"unknown PTD config key {key!r}; allowed keys: {sorted(PTD_CONFIG_KEYS)}"
                )
        return cls(**{key: PTD_CONFIG_KEYS[key].check(key, value) for key, value in d.items()})


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def markdown_table() -> str:
    """The README's table of keys: type, what is allowed, default (on CPU where it differs)
    and meaning, one row per key in `PTD_CONFIG_KEYS` order."""
    defaults = PTDConfig()
    rows = ["| key | type | allowed | default | meaning |", "|---|---|---|---|---|"]
    for key, spec in PTD_CONFIG_KEYS.items():
        default = _shown(getattr(defaults, key))
        if key in CPU_DEFAULTS:
            default = f"{_shown(CPU_DEFAULTS[key])} on CPU, {default} elsewhere"
        kind = {int: "int", bool: "bool", str: "string"}[spec.kind]
        rows.append(f"| {key} | {kind} | {spec.allowed()} | {default} | {spec.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
