"""Reading PTD's worker-side counters from an offline `LLM` in tests."""

from __future__ import annotations

import time

# Repetitive contexts, so that drafts (context matches and the pool) get accepted often.
REPETITIVE_PROMPTS = [
    ("Repeat after me: the cat sat on the mat. the cat sat on the mat. the cat sat on the"
     " mat. the cat"),
    "apple, banana, cherry, apple, banana, cherry, apple, banana, cherry, apple,",
    ("for i in range(10):\n    print(i)\nfor j in range(10):\n    print(j)\nfor k in range(10):"
     "\n   "),
]


def ptd_snapshots(llm) -> list[dict]:
    """The PTD proposer's counters of every worker (one per rank)."""
    from vllm_ptd.vllm_integration.introspection import ptd_snapshot

    return llm.collective_rpc(ptd_snapshot)


def snapshot(llm) -> dict:
    return ptd_snapshots(llm)[0]


def settled_live_states(llm, timeout: float = 10.0) -> int:
    """PTD's live per-request entries (summed over ranks) once the engine has told the
    workers about the last finished or aborted requests. The scheduler passes finished ids to
    the workers with its next step (an empty step when nothing else runs), which can come just
    after the front end saw the request end, and a `collective_rpc` sent in between overtakes
    it; so poll briefly. A real leak stays above 0."""
    deadline = time.monotonic() + timeout
    while True:
        live = sum(s["live_states"] for s in ptd_snapshots(llm))
        if live == 0 or time.monotonic() > deadline:
            return live
        time.sleep(0.2)
