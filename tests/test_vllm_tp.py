"""PTD under tensor parallelism: TP=3 (vLLM's CPU build, one process per rank) gives the same
greedy output as plain decoding at TP=1, and every rank builds and verifies the same trees.

The embedded model has 9 query heads and 3 KV heads, so TP must divide 3. Why the ranks agree
is documented in docs/tensor_parallelism.md; this test checks it on every verified tree: each
rank folds (request id, layout tokens, layout parents, committed tokens) of every tree it
verifies into a hash, and the three hashes and all PTD counters must be equal.
"""

from __future__ import annotations

import gc

import pytest
from engine_helpers import settled_live_states

pytestmark = pytest.mark.engine

TP = 3
NEW_TOKENS = 64
MAX_MODEL_LEN = 1024


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    from transformers import AutoTokenizer

    from vllm_ptd.datasets import DATASETS, sample_prompts
    from vllm_ptd.model import default_model_path

    tok = AutoTokenizer.from_pretrained(default_model_path())
    questions = [q for name in DATASETS for q in sample_prompts(name, 2)][:6]
    return [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                    add_generation_prompt=True) for q in questions]


def _generate(llm, prompts) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def plain_tp1(prompts) -> list[list[int]]:
    from vllm_ptd.engine_utils import make_llm

    llm = make_llm(ptd=None, max_model_len=MAX_MODEL_LEN)
    out = _generate(llm, prompts)
    del llm
    gc.collect()
    return out


def test_ptd_at_tp3_equals_plain_at_tp1_and_every_rank_builds_the_same_trees(
        prompts, plain_tp1, monkeypatch):
    from tree_digest import record_tree_digest, tree_digest

    from vllm_ptd.engine_utils import make_llm
    from vllm_ptd.vllm_integration.introspection import ptd_snapshot

    # vLLM's CPU build runs one process per rank; bind their OpenMP threads to the 2 cores
    # of the CI machine (ranks 0 and 2 share core 0), and keep each rank's KV cache small.
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1|0")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    llm = make_llm(ptd={}, max_model_len=MAX_MODEL_LEN, tensor_parallel_size=TP,
                   distributed_executor_backend="mp")
    try:
        assert llm.collective_rpc(record_tree_digest) == [True] * TP
        got = _generate(llm, prompts)
        snaps = llm.collective_rpc(ptd_snapshot)
        digests = llm.collective_rpc(tree_digest)
        live = settled_live_states(llm)
    finally:
        del llm
        gc.collect()

    assert [i for i, (a, b) in enumerate(zip(got, plain_tp1)) if a != b] == []
    assert len(snaps) == TP
    # every rank verified the same trees (tokens and shape) with the same results
    assert digests[0]["trees"] > 0
    assert all(d == digests[0] for d in digests), digests
    # and its counters agree (host time is each process's own)
    counters = [{k: v for k, v in s.items() if k != "host_ms_per_step"} for s in snaps]
    assert all(c == counters[0] for c in counters), counters
    snap = snaps[0]
    # every verified draft went through the digest; steps without drafts count in steps too
    assert snap["drafted_steps"] == digests[0]["trees"] <= snap["steps"]
    assert snap["tokens"] > snap["steps"]  # drafts were accepted: PTD was really in play
    assert live == 0 and snap["fallbacks"] == 0
    print(f"\nTP={TP}: {snap['steps']} trees verified on each rank, DE {snap['DE']:.2f}")
