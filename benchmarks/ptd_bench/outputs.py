"""Greedy output comparison with plain decoding, and the speedup column."""

from __future__ import annotations

from .workloads import Workload


def request_keys(workload: Workload) -> list[tuple[int, int]]:
    """(conversation, turn) of every request, in the order runs return outputs."""
    return [(i, t) for i, conv in enumerate(workload.conversations) for t in range(len(conv))]


def compare(outputs: list, reference: list | None, workload: Workload) -> dict:
    """Mismatches against plain decoding's outputs of the same requests (token ids offline,
    text for servers). None when there is nothing to compare with (plain itself, or no plain
    run). Each entry says where the two outputs first differ."""
    if reference is None:
        return {"mismatches": None, "mismatched": []}
    bad = []
    for (conv, turn), out, ref in zip(request_keys(workload), outputs, reference):
        if out != ref:
            first = next((k for k, (a, b) in enumerate(zip(out, ref)) if a != b),
                         min(len(out), len(ref)))
            bad.append({"conversation": conv, "turn": turn, "first_difference": first})
    return {"mismatches": len(bad), "mismatched": bad}


def add_speedups(rows: list[dict]) -> None:
    """speedup = tokens/s / plain's tokens/s on the same dataset, concurrency and mode."""
    base = {(r["mode"], r["dataset"], r["concurrency"]): r["tokens_per_s"]
            for r in rows if r["kind"] == "plain"}
    for r in rows:
        plain = base.get((r["mode"], r["dataset"], r["concurrency"]))
        r["speedup"] = r["tokens_per_s"] / plain if plain else None
