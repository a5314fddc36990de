"""PTD's host/device copies go through one place (`StepTransfers`), a constant number per step
whatever the number of drafting requests (vllm_integration/step_transfers.py)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from engine_helpers import REPETITIVE_PROMPTS, settled_live_states, snapshot

from vllm_ptd.vllm_integration.step_transfers import StepTransfers


@pytest.mark.parametrize("rows", [1, 15, 16, 17, 40])
def test_cpu_argmax_in_blocks_picks_what_plain_decoding_picks(rows):
    # bf16 logits are converted to float32 16 rows at a time through one reused buffer; the
    # argmax must be vLLM's greedy_argmax over the whole float32 tensor, ties included
    # (first index), in one read.
    from vllm_ptd.vllm_integration.tree_verification import greedy_argmax

    generator = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows, 4099, generator=generator).to(torch.bfloat16)
    logits[:, 7] = logits.max() + 1          # a tie in every row: index 7 wins, not 11
    logits[:, 11] = logits[:, 7]
    logits[rows // 2, 3000] = logits.max() + 2
    transfers = StepTransfers("cpu")
    transfers.start_step()
    for _ in range(2):   # the buffer is reused, whatever it held
        got = greedy_argmax(logits, transfers)
        expected = torch.ops._C.greedy_argmax(logits.float()).view(-1).numpy()
        assert got.tolist() == expected.tolist()
        assert got[0] == (3000 if rows // 2 == 0 else 7) and got[rows // 2] == 3000
    assert transfers.counts.reads == 2
    assert greedy_argmax(logits.float(), transfers).tolist() == expected.tolist()


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
