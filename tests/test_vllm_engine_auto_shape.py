"""draft_shape "auto" in the real vLLM engine (float32, greedy): steps switch between chains
and trees, one request's drafts changing shape from step to step, and the output stays
plain decoding's."""

from __future__ import annotations

import gc

import pytest
from engine_helpers import REPETITIVE_PROMPTS, settled_live_states, snapshot

pytestmark = pytest.mark.engine

NEW_TOKENS = 48


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    from transformers import AutoTokenizer

    from vllm_ptd.datasets import sample_prompts
    from vllm_ptd.model import default_model_path

    tok = AutoTokenizer.from_pretrained(default_model_path())
    questions = sample_prompts("gsm8k", 1) + sample_prompts("humaneval", 1)
    return REPETITIVE_PROMPTS[:2] + [
        tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                add_generation_prompt=True) for q in questions]


def _generate(llm, prompts: list[str]) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


def _run(ptd: dict | None, prompts: list[str], prepare=None) -> tuple[list, list, dict]:
    """Outputs all at once, then the first prompt alone, and PTD's snapshot."""
    from vllm_ptd.engine_utils import make_llm

    llm = make_llm(ptd=ptd, max_num_seqs=len(prompts), max_model_len=1024)
    try:
        if prepare is not None:
            assert llm.collective_rpc(prepare) == [True]
        together, alone = _generate(llm, prompts), _generate(llm, prompts[:1])
        snap = snapshot(llm) if ptd is not None else {}
        if ptd is not None:
            assert settled_live_states(llm) == 0
        return together, alone, snap
    finally:
        del llm
        gc.collect()


def test_auto_shape_switches_between_chains_and_trees_with_plain_output(prompts) -> None:
    def explore_every_other_step(worker) -> bool:
        # The other shape after one step without it (after four when one wins clearly):
        # requests switch shapes many times in 48 tokens, whatever the measured costs say.
        policy = worker.model_runner.drafter.policy
        policy.shape_explore_after = 1
        return policy.auto

    plain = _run(None, prompts)
    together, alone, snap = _run({"draft_shape": "auto"}, prompts, explore_every_other_step)
    print(f"\nauto: {snap['chain_steps']} chain and {snap['tree_steps']} tree request-steps, "
          f"DE {snap['tokens'] / snap['steps']:.2f}, costs {snap['cost_model_ms']}")
    assert together == plain[0] and alone == plain[1]
    assert snap["tree_steps"] > 0 and snap["masked_blocks"] > 0   # trees took the masked path
    assert snap["chain_steps"] > 0                                 # and chains ran too
    assert snap["chain_steps"] + snap["tree_steps"] == snap["drafted_steps"]
    assert snap["tokens"] > snap["steps"]                          # drafts were accepted
    # the cost model was told which timed steps carried trees
    assert 0 < snap["cost_samples"]["with_trees"] < snap["cost_samples"]["steps"]
    assert snap["step_shape"] in ("tree", "chain")
