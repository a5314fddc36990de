"""The chain of one step (config draft_shape "chain") and the evidence behind each of its rows.

A chain is C's first path: the most frequent continuation of the longest n-gram match, in
the request's own context or (when they match a longer n-gram) in other requests' finished
outputs (core/shared_outputs.py), followed as far as the pool agrees with it, then the
pool's freshest branch; with no match, the pool's freshest branch from x. Each row gets an
evidence class, the key under which `core.budget.RowAcceptanceModel` learns how often such a
row is accepted once the rows before it were: where it came from (pool only, or a match in
the own context or the shared outputs, how many of the matched occurrences agree with it,
whether the pool has it too), the length of the matched n-gram, and its depth. Suffix-style drafters weigh rows the same way (by the frequencies
in their suffix tree); PTD learns the weights from its own verifications instead.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm_ptd.core.context_index import ContextIndex
from vllm_ptd.core.shared_outputs import SharedOutputs

# Sources, the first digit of a class: the pool alone (after a match's path ended, or no
# match), or a match in the request's own context or in other requests' outputs, agreed by
# one or by several of the occurrences used, with or without the pool having the same path.
POOL = 0
CONTEXT, SHARED = 1, 5   # + 2 * (several occurrences agree) + (the pool agrees)
NUM_SOURCES = 9
# match length -> bucket: 1, 2, 3-4, 5-11 and 12 or longer (the last two only when a match of
# context_ngram tokens is followed further back, config match_length)
NGRAM_BUCKETS = (0, 1, 2, 3, 3, 4, 4, 4, 4, 4, 4, 4)
NUM_NGRAM_BUCKETS = 6
MAX_DEPTH_BUCKET = 4     # rows 4 deep or deeper share a class
# class % CLASSES_PER_SOURCE: the class's evidence shape (match length bucket and depth,
# whatever its source), whose rate is the prior of a class (core.budget.RowAcceptanceModel)
CLASSES_PER_SOURCE = NUM_NGRAM_BUCKETS * MAX_DEPTH_BUCKET
NUM_CLASSES = NUM_SOURCES * CLASSES_PER_SOURCE


def match_source(origin: int, agree: int, in_pool: bool) -> int:
    """The source of a matched row: origin CONTEXT or SHARED, `agree` occurrences."""
    return origin + 2 * int(agree > 1) + int(in_pool)


def rows_from_shared(classes) -> int:
    """How many rows with these classes were drafted from other requests' outputs."""
    return sum(1 for cls in classes if cls // CLASSES_PER_SOURCE >= SHARED)


def ngram_bucket(ngram: int) -> int:
    return NGRAM_BUCKETS[ngram] if ngram < len(NGRAM_BUCKETS) else NUM_NGRAM_BUCKETS - 1


def row_class(source: int, ngram: int, depth: int) -> int:
    """Evidence class of a chain row (0 <= class < NUM_CLASSES)."""
    bucket = 0 if source == POOL else ngram_bucket(ngram)
    return _CLASSES[source][bucket][min(depth, MAX_DEPTH_BUCKET) - 1]


# _CLASSES[source][bucket][depth - 1]: a table, since every row of every request's chain
# needs its class every step.
_CLASSES = [[[(source * NUM_NGRAM_BUCKETS + bucket) * MAX_DEPTH_BUCKET + depth
              for depth in range(MAX_DEPTH_BUCKET)]
             for bucket in range(NUM_NGRAM_BUCKETS)]
            for source in range(NUM_SOURCES)]


def choose_chain(own: tuple[list[int], list[int]], other: tuple[list[int], list[int]] | None,
                 ngrams: tuple[int, int], value: Callable[[list[int]], float] | None = None
                 ) -> tuple[list[int], list[int]]:
    """The one of `candidate_chains`'s results the step drafts: the chain worth more by
    `value` (a function of the classes; default: the longer matched n-gram, the own context
    on ties)."""
    if other is None:
        return own
    if value is None:
        return other if ngrams[1] > ngrams[0] else own
    return other if value(other[1]) > value(own[1]) else own


def candidate_chains(context: ContextIndex | None, pool_root: dict | None, limit: int,
                     context_depth: int, context_matches: int,
                     shared: SharedOutputs | None = None
                     ) -> tuple[tuple[list[int], list[int]], tuple[list[int], list[int]] | None,
                                tuple[int, int]]:
    """The chains a step chooses between (`choose_chain`), at most `limit` rows each:
    (own, other, (n, shared n)), each chain (tokens, classes). own: from the request's
    context, its history ending with x (the pool's trie for x, `{token: children}` oldest
    first, alone without one), other: from the shared outputs (other requests' outputs;
    needs `context` for the history), None when they match nothing; n: each one's matched
    n-gram length."""
    if context is None or limit <= 0:
        return _follow(None, 0, [], [], pool_root, limit), None, (0, 0)
    ngram, path, agree = context.best_path(context_depth, context_matches)
    own = _follow(CONTEXT, ngram, path, agree, pool_root, limit)
    if shared is None:
        return own, None, (ngram, 0)
    s_ngram, s_path, s_agree = shared.best_path(context.tokens, context_depth, context_matches)
    if not s_path:
        return own, None, (ngram, 0)
    return own, _follow(SHARED, s_ngram, s_path, s_agree, pool_root, limit), (ngram, s_ngram)


def _follow(origin: int | None, ngram: int, path: list[int], agree: list[int],
            pool_root: dict | None, limit: int) -> tuple[list[int], list[int]]:
    """A match's path as far as `limit`, then the pool's freshest continuation."""
    tokens: list[int] = path[:limit]
    classes: list[int] = []
    node = pool_root or None
    last = MAX_DEPTH_BUCKET - 1
    if tokens:
        bucket = ngram_bucket(ngram)
        for depth, (tok, count) in enumerate(zip(tokens, agree)):
            in_pool = node is not None and tok in node
            node = node[tok] if in_pool else None
            # row_class(source, ngram, depth + 1), with the bucket looked up once a chain
            classes.append(_CLASSES[match_source(origin, count, in_pool)][bucket][min(depth, last)])
    pool_classes = _CLASSES[POOL][0]
    while node and len(tokens) < limit:
        tok = next(reversed(node))   # the freshest branch
        node = node[tok]
        classes.append(pool_classes[min(len(tokens), last)])
        tokens.append(tok)
    return tokens, classes
