"""Read PTD's worker-side counters from the front end: `llm.collective_rpc(ptd_snapshot)`."""

from __future__ import annotations


def ptd_snapshot(worker) -> dict | None:
    """Runs inside each worker: the PTD proposer's counters, or None without PTD."""
    from vllm_ptd.vllm_integration.proposer import PTDProposer

    drafter = getattr(worker.model_runner, "drafter", None)
    return drafter.snapshot() if isinstance(drafter, PTDProposer) else None


def inject_ptd_faults(worker, stage: str, count: int) -> bool:
    """Test hook, runs inside each worker: make the next `count` per-request calls of PTD's
    `stage` ("propose" or "verify") raise, to exercise the fallback to plain decoding."""
    from vllm_ptd.vllm_integration.proposer import PTDProposer

    drafter = getattr(worker.model_runner, "drafter", None)
    if not isinstance(drafter, PTDProposer):
        return False
    drafter.injected_faults[stage] = count
    return True
