"""Read PTD's worker-side counters from the front end.

Offline: `llm.collective_rpc(ptd_snapshot)`.

From `vllm serve` (another process): start the server with
`--worker-extension-cls vllm_ptd.vllm_integration.introspection.PTDWorkerExtension` and the
environment variable `VLLM_SERVER_DEV_MODE=1` (vLLM's development endpoints; do not expose
such a server), then `POST /collective_rpc` with `{"method": "ptd_snapshot"}` returns
`{"results": [<snapshot of each worker>]}`. Tests use this to check that per-request state is
back to empty (`live_states == 0`) after a load.
"""

from __future__ import annotations


def ptd_snapshot(worker) -> dict | None:
    """Runs inside each worker: the PTD proposer's counters, or None without PTD."""
    from vllm_ptd.vllm_integration.proposer import PTDProposer

    drafter = getattr(worker.model_runner, "drafter", None)
    return drafter.snapshot() if isinstance(drafter, PTDProposer) else None


class PTDWorkerExtension:
    """Mixed into vLLM's worker class by `--worker-extension-cls` (vLLM's extension hook), so
    that `collective_rpc("ptd_snapshot")` (a method name, as vLLM's HTTP endpoint sends)
    reaches `ptd_snapshot`. Read-only: it adds no other behaviour."""

    def ptd_snapshot(self) -> dict | None:
        return ptd_snapshot(self)
