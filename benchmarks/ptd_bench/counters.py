"""Per-run draft metrics from engine counters: PTD's worker snapshot or vLLM's spec-decode
counters, read before and after a timed run so warm-up and earlier runs drop out.

Counters are cumulative since engine start; the PTD snapshot only exposes ratios (DE, HR, AL,
per-step means), so the raw sums are rebuilt as ratio x steps before taking differences."""

from __future__ import annotations

import os

# `llm.collective_rpc(<function>)` pickles the function to the engine process; vLLM refuses
# that unless this is set. Set at import, before any engine exists.
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

_VLLM = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
}


def read_ptd(llm) -> dict:
    """Cumulative PTD sums from the first worker (all workers of one engine see one batch)."""
    from vllm_ptd.vllm_integration.introspection import ptd_snapshot

    snap = next(s for s in llm.collective_rpc(ptd_snapshot) if s is not None)
    steps = snap["steps"]
    hits = snap["HR"] * steps
    return {
        "steps": steps, "tokens": snap["tokens"], "hits": hits,
        "accepted": max(snap["AL"] - 1.0, 0.0) * hits,
        "C_nodes": snap["C_nodes_per_step"] * steps,
        "T_nodes": snap["T_nodes_per_step"] * steps,
        "host_ms": snap["host_ms_per_step"] * steps,
        "fallbacks": snap.get("fallbacks", 0),
        "by_depth": list(snap.get("accepted_by_depth", [])),
        # what the budget policy had learned when read (absent with the budget off)
        "budget": {k: snap[k] for k in BUDGET_STATE if k in snap},
    }


# The budget policy's state in PTD's snapshot (PTDProposer._policy_snapshot): its fitted step
# costs and chain prices, which tell why a run drafted as much or as little as it did.
BUDGET_STATE = ("cost_model_ms", "cost_samples", "chain_prices", "accepted_per_chain",
                "step_shape")


def _own_spec_counters(llm) -> dict | None:
    """This engine's own spec-decode counters, read from its Prometheus stat logger. With
    several engines in one process (`--interleave`) the registry behind `get_metrics` holds
    only the last engine's collectors, so each engine's counters are read directly."""
    manager = getattr(getattr(llm, "llm_engine", None), "logger_manager", None)
    for logger in getattr(manager, "stat_loggers", None) or ():
        prom = getattr(logger, "spec_decoding_prom", None)
        if prom is None:
            continue
        def total(counters) -> int:
            items = counters.values() if isinstance(counters, dict) else counters
            return int(sum(c._value.get() for c in items))
        by_pos = [0] * max((len(v) for v in
                            prom.counter_spec_decode_num_accepted_tokens_per_pos.values()),
                           default=0)
        for children in prom.counter_spec_decode_num_accepted_tokens_per_pos.values():
            by_pos = _add(by_pos, [int(c._value.get()) for c in children])
        return {"drafts": total(prom.counter_spec_decode_num_drafts),
                "draft_tokens": total(prom.counter_spec_decode_num_draft_tokens),
                "accepted": total(prom.counter_spec_decode_num_accepted_tokens),
                "by_depth": by_pos}
    return None


def read_vllm(llm) -> dict:
    """Cumulative spec-decode counters of vLLM (zeros without speculation)."""
    try:
        own = _own_spec_counters(llm)
    except (AttributeError, TypeError):  # another vLLM layout: use the registry below
        own = None
    if own is not None:
        return own
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "by_depth": []}
    for metric in llm.get_metrics():
        if metric.name in _VLLM:
            out[_VLLM[metric.name]] += int(getattr(metric, "value", 0))
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["by_depth"] = _add(out["by_depth"], [int(v) for v in metric.values])
    return out


def _add(a: list, b: list, sign: int = 1) -> list:
    n = max(len(a), len(b))
    a, b = a + [0] * (n - len(a)), b + [0] * (n - len(b))
    return [x + sign * y for x, y in zip(a, b)]


def _trim(depths: list) -> list:
    while depths and not depths[-1]:
        depths = depths[:-1]
    return [round(d) for d in depths]


def ptd_metrics(before: dict, after: dict) -> dict:
    """The paper's metrics over the steps between two `read_ptd` results."""
    d = {k: after[k] - before[k] for k in after if k not in ("by_depth", "budget")}
    steps, hits = d["steps"], d["hits"]
    return {
        "DE": d["tokens"] / steps if steps else None,
        "HR": hits / steps if steps else None,
        "AL": 1.0 + d["accepted"] / hits if hits > 0.5 else None,
        "C_nodes_per_step": d["C_nodes"] / steps if steps else None,
        "T_nodes_per_step": d["T_nodes"] / steps if steps else None,
        "host_ms_per_step": d["host_ms"] / steps if steps else None,
        "steps": steps, "fallbacks": d["fallbacks"],
        "accepted_by_depth": _trim(_add(after["by_depth"], before["by_depth"], -1)),
        "budget_at_end": after.get("budget", {}),
    }


def vllm_metrics(before: dict, after: dict, tokens: int, requests: int) -> dict:
    """The same metrics for vLLM's drafters. Each decode step of a request commits 1 + its
    accepted drafts, and the first token of every request comes from prefill (PTD does not
    count prefill either), so decode steps = tokens - requests - accepted. vLLM also counts
    drafts accepted past max_tokens, which are then cut; every drafted step is still one step,
    hence the floor at `drafts`."""
    d = {k: after[k] - before[k] for k in _VLLM.values()}
    decoded = tokens - requests
    steps = max(decoded - d["accepted"], d["drafts"])
    if steps <= 0:
        return {"DE": None, "HR": None, "AL": None, "steps": 0}
    return {
        "DE": decoded / steps,
        "HR": d["drafts"] / steps,
        "AL": 1.0 + d["accepted"] / d["drafts"] if d["drafts"] else None,
        # vLLM verifies every draft token it proposes: those are its C nodes; it has no T.
        "C_nodes_per_step": d["draft_tokens"] / steps,
        "T_nodes_per_step": 0.0,
        "host_ms_per_step": None,
        "steps": steps,
        "accepted_by_depth": _trim(_add(after["by_depth"], before["by_depth"], -1)),
    }


def plain_metrics() -> dict:
    """Plain decoding commits one token per step by definition."""
    return {"DE": 1.0, "HR": 0.0, "AL": None, "C_nodes_per_step": 0.0, "T_nodes_per_step": 0.0,
            "host_ms_per_step": None, "accepted_by_depth": []}
