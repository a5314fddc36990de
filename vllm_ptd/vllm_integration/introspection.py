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


def record_tree_digest(worker) -> bool:
    """Test hook, runs inside each worker: from now on fold every verified tree (request id,
    layout tokens and parents, committed tokens) into a running hash, so that tests can check
    that all tensor-parallel ranks built and verified exactly the same trees. Read it with
    `tree_digest`. Wraps the proposer instance's `record_step`; no effect without PTD."""
    import hashlib

    import numpy as np

    from vllm_ptd.vllm_integration.proposer import PTDProposer

    drafter = getattr(worker.model_runner, "drafter", None)
    if not isinstance(drafter, PTDProposer):
        return False
    digest = hashlib.blake2b(digest_size=16)
    counter = {"trees": 0}
    record_step = drafter.record_step

    def recording(req_id, layout, argmax, result):
        digest.update(req_id.encode())
        digest.update(np.asarray(layout.tokens, dtype=np.int64).tobytes())
        digest.update(np.asarray(layout.parents, dtype=np.int64).tobytes())
        digest.update(np.asarray(result.tokens, dtype=np.int64).tobytes())
        counter["trees"] += 1
        return record_step(req_id, layout, argmax, result)

    drafter.record_step = recording
    drafter._ptd_tree_digest = (digest, counter)  # test hook state, read by tree_digest
    return True


def tree_digest(worker) -> dict | None:
    """Test hook: {"trees": verified trees, "digest": hex} since `record_tree_digest`."""
    state = getattr(getattr(worker.model_runner, "drafter", None), "_ptd_tree_digest", None)
    if state is None:
        return None
    digest, counter = state
    return {"trees": counter["trees"], "digest": digest.hexdigest()}
