"""Test-only: a running hash of every tree a worker verifies, to check that all tensor-parallel
ranks build and verify exactly the same trees.

`llm.collective_rpc(record_tree_digest)` starts it in each worker (it wraps the proposer
instance's `finish_step`); `llm.collective_rpc(tree_digest)` reads it.
"""

from __future__ import annotations

import hashlib
import sys

import cloudpickle
import numpy as np

# Sent to the engine's workers by value: they need not import this test directory.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def record_tree_digest(worker) -> bool:
    """Runs inside each worker: from now on fold every verified tree (request id, layout
    tokens and parents, committed tokens) into a running hash. False without PTD."""
    from vllm_ptd.vllm_integration.proposer import PTDProposer

    drafter = getattr(worker.model_runner, "drafter", None)
    if not isinstance(drafter, PTDProposer):
        return False
    digest = hashlib.blake2b(digest_size=16)
    counter = {"trees": 0}
    finish_step = drafter.finish_step

    def recording(verdicts):
        for req_id, record in verdicts.records.items():
            digest.update(req_id.encode())
            digest.update(np.asarray(record.layout.tokens, dtype=np.int64).tobytes())
            digest.update(np.asarray(record.layout.parents, dtype=np.int64).tobytes())
            digest.update(np.asarray(record.result.tokens, dtype=np.int64).tobytes())
            counter["trees"] += 1
        return finish_step(verdicts)

    drafter.finish_step = recording
    drafter._test_tree_digest = (digest, counter)
    return True


def tree_digest(worker) -> dict | None:
    """Runs inside each worker: {"trees": verified trees, "digest": hex} since
    `record_tree_digest`."""
    state = getattr(getattr(worker.model_runner, "drafter", None), "_test_tree_digest", None)
    if state is None:
        return None
    digest, counter = state
    return {"trees": counter["trees"], "digest": digest.hexdigest()}
