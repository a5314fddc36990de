"""Functions that run inside vLLM's workers through `llm.collective_rpc`.

vLLM ships them with cloudpickle, which sends functions of importable modules by name; the
worker cannot import `benchmarks`, so this module is registered to travel by value."""

from __future__ import annotations

import sys

import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def reset_suffix_cache(worker) -> int:
    """Forget the responses suffix decoding cached from earlier runs (it drafts from every
    finished response, so a second run over the same prompts would replay the first one's
    answers); returns how many were dropped, 0 without suffix decoding."""
    drafter = getattr(worker.model_runner, "drafter", None)
    cache = getattr(drafter, "suffix_cache", None)
    if cache is None:
        return 0
    cached = list(cache.cached_requests)
    for req_id in cached:
        cache.evict_cached_response(req_id)
    return len(cached)


def reset_ptd_shared_outputs(worker) -> int:
    """Forget the finished outputs PTD's chains draft from (the counterpart of suffix
    decoding's cached responses); returns how many tenants were dropped, 0 without them."""
    drafter = getattr(worker.model_runner, "drafter", None)
    shared = getattr(drafter, "shared", None)
    return 0 if shared is None else shared.clear()
