"""PTD's host/device copies go through one place (`StepTransfers`), a constant number per step
whatever the number of drafting requests (vllm_integration/step_transfers.py)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from engine_helpers import REPETITIVE_PROMPTS, settled_live_states, snapshot

from vllm_ptd.vllm_integration.step_transfers import StepTransfers


def test_transfers_are_counted_per_step():
    transfers = StepTransfers("cpu")
    transfers.start_step()
    up = transfers.upload("positions", np.arange(6).reshape(2, 3), torch.int64)
    assert up.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert transfers.read(torch.tensor([7, 8])).tolist() == [7, 8]
    transfers.start_step()
    transfers.upload("rows", np.zeros(4), torch.int32)
    transfers.upload("rows", np.zeros(4), torch.int32)
    transfers.start_step()
    c = transfers.counts
    assert (c.uploads, c.reads, c.steps) == (3, 1, 2)
    assert (c.max_uploads_per_step, c.max_reads_per_step) == (2, 1)


@pytest.mark.engine
def test_a_step_makes_the_same_few_transfers_for_one_request_and_for_many():
    from vllm import SamplingParams

    from vllm_ptd.engine_utils import make_llm

    llm = make_llm(ptd={"draft_shape": "tree", "adaptive_budget": False}, max_model_len=512)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=48)
        llm.generate(REPETITIVE_PROMPTS[:1], params, use_tqdm=False)
        one = dict(snapshot(llm)["transfers"])
        llm.generate(REPETITIVE_PROMPTS * 2, params, use_tqdm=False)
        many = snapshot(llm)
        assert settled_live_states(llm) == 0
    finally:
        del llm
        gc.collect()
    for counts in (one, many["transfers"]):
        assert counts["steps"] > 10
        # CPU: tree positions and the sampler output up, the rows' argmax down. (On a GPU the
        # masks and the KV compaction pairs add one upload each.)
        assert counts["max_reads_per_step"] == 1, counts
        assert counts["max_uploads_per_step"] <= 2, counts
    assert many["masked_blocks"] > 0 and many["DE"] > 1.0
