"""Tree-row distributions equal vLLM's own Sampler on the same history, setting by setting.

For each tree row, vLLM is given a request whose output is exactly that row's history (the
committed output, then the C path to the row) in a real `InputBatch` with vLLM's builtin
logits processors; its Sampler's processed logits and sampling distribution must equal what
`tree_sampling` computes for the row. This is the deterministic half of the sampling
guarantee; the statistical half runs the real engine (tests/test_vllm_sampling_ptd.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pytest
import torch
from test_core_verify import layout_from_paths

from vllm_ptd.core.layout import TreeLayout
from vllm_ptd.vllm_integration.tree_sampling import (
    TreeRowDistributions,
    alters_logits,
    is_greedy,
    node_histories,
)

VOCAB = 96
PROMPT = [5, 17, 17, 40, 3, 9]
OUTPUT = [11, 12, 17, 30]   # ends with x = 30
LAYOUT = layout_from_paths(30, [(31, 32, 33), (31, 40), (7, 12), (7, 8, 9)], n_t=3)

SETTINGS = {
    "temperature": {"temperature": 0.7},
    "top_k": {"temperature": 1.3, "top_k": 5},
    "top_p": {"temperature": 0.7, "top_p": 0.9},
    "min_p": {"temperature": 1.0, "min_p": 0.2},
    "all_filters": {"temperature": 0.8, "top_k": 20, "top_p": 0.8, "min_p": 0.05},
    "repetition_penalty": {"temperature": 0.9, "repetition_penalty": 1.3},
    "presence_penalty": {"temperature": 0.9, "presence_penalty": 0.8},
    "frequency_penalty": {"temperature": 0.9, "frequency_penalty": 0.6},
    "logit_bias": {"temperature": 0.9, "logit_bias": {12: 5.0, 40: -3.0, 33: 2.5}},
    "allowed_token_ids": {"temperature": 0.9, "allowed_token_ids": [8, 9, 12, 31, 32, 33, 40]},
    "bad_words": {"temperature": 0.9},   # token ids set below (no tokenizer here)
    "min_tokens": {"temperature": 0.9, "min_tokens": 6, "stop_token_ids": [9, 33]},
    "greedy_penalties": {"temperature": 0.0, "repetition_penalty": 1.5, "presence_penalty": 1.0},
    "greedy_logit_bias": {"temperature": 0.0, "logit_bias": {8: 30.0}},
    "greedy_min_tokens": {"temperature": 0.0, "min_tokens": 7, "stop_token_ids": [9, 40]},
}
# [33] bans 33 everywhere; [31, 40] bans 40 after 31 (a C path); [12, 7] bans 7 after 12.
BAD_WORDS = [[33], [31, 40], [12, 7]]


def _params(name: str):
    from vllm import SamplingParams

    params = SamplingParams(**SETTINGS[name])
    if name == "bad_words":
        params._bad_words_token_ids = BAD_WORDS
    return params


def tree_distributions(raw_logits: torch.Tensor, layout: TreeLayout, params,
                       prompt_token_ids: Sequence[int], output_token_ids: Sequence[int]
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(processed logits, sampling probs or None for greedy) at x and every C row, stacked
    from the rows the engine computes one by one."""
    rows = TreeRowDistributions(raw_logits, layout, params, prompt_token_ids,
                                output_token_ids)
    n = len(rows.histories)
    logits = torch.stack([rows.processed_logits(r) for r in range(n)])
    if is_greedy(params):
        return logits, None
    return logits, torch.stack([rows.probs[r] for r in range(n)])


def _vllm_batch(params, histories):
    """A real InputBatch holding one request per history, with vLLM's builtin processors."""
    from vllm.v1.sample.logits_processor import BUILTIN_LOGITS_PROCESSORS, LogitsProcessors
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=len(histories)))
    procs = LogitsProcessors(c(config, torch.device("cpu"), False)
                             for c in BUILTIN_LOGITS_PROCESSORS)
    batch = InputBatch(max_num_reqs=len(histories), max_model_len=64,
                       max_num_batched_tokens=256, device=torch.device("cpu"),
                       vocab_size=VOCAB, block_sizes=[16], max_num_blocks_per_req=[4],
                       logitsprocs=procs)
    for r, history in enumerate(histories):
        batch.add_request(CachedRequestState(
            req_id=f"r{r}", prompt_token_ids=list(PROMPT), mm_features=[],
            sampling_params=params, generator=None, block_ids=([0],),
            num_computed_tokens=len(PROMPT) + len(history) - 1,
            output_token_ids=list(history)))
    batch.refresh_metadata()
    return batch.sampling_metadata


def _vllm_processed(logits, params, histories):
    """vLLM Sampler's processed logits (before the greedy argmax) and, for random sampling,
    the distribution it draws from."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.sample.sampler import Sampler

    md = _vllm_batch(params, histories)
    sampler = Sampler()
    processed = sampler.apply_logits_processors(logits.clone(), md, predict_bonus_token=False)
    if md.all_greedy:
        return processed, None
    scaled = sampler.apply_temperature(processed.clone(), md.temperature, md.all_random)
    for proc in md.logitsprocs.argmax_invariant:
        scaled = proc.apply(scaled)
    scaled = apply_top_k_top_p(scaled, md.top_k, md.top_p)
    return processed, scaled.softmax(dim=-1, dtype=torch.float32)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_tree_rows_match_vllm_sampler(name):
    params = _params(name)
    gen = torch.Generator().manual_seed(sorted(SETTINGS).index(name))
    raw = torch.randn(len(LAYOUT), VOCAB, generator=gen) * 3
    histories = node_histories(LAYOUT, OUTPUT)
    ours_logits, ours_probs = tree_distributions(raw, LAYOUT, params, PROMPT, OUTPUT)
    ref_logits, ref_probs = _vllm_processed(raw[: len(histories)].float(), params, histories)
    torch.testing.assert_close(ours_logits, ref_logits, rtol=0, atol=0)
    if ref_probs is None:
        assert ours_probs is None
    else:
        torch.testing.assert_close(ours_probs, ref_probs, rtol=0, atol=0)
    if name != "temperature" and not name.startswith("top") and name not in (
            "min_p", "all_filters"):
        assert alters_logits(params)


def test_histories_follow_the_c_path():
    hist = node_histories(LAYOUT, OUTPUT)
    assert len(hist) == 1 + LAYOUT.num_candidates
    assert hist[0] == OUTPUT
    tokens = LAYOUT.tokens.tolist()
    for r in range(1, len(hist)):
        parent = int(LAYOUT.parents[r])
        assert hist[r] == hist[parent] + [tokens[r]]
    assert OUTPUT + [31, 32, 33] in hist and OUTPUT + [7, 8, 9] in hist


def test_settings_that_change_the_greedy_choice_are_detected():
    from vllm import SamplingParams

    assert not alters_logits(SamplingParams(temperature=0.0))
    assert not alters_logits(SamplingParams(temperature=0.8, top_p=0.9, top_k=5, min_p=0.1))
    assert alters_logits(SamplingParams(temperature=0.0, min_tokens=3))
    assert alters_logits(SamplingParams(temperature=0.0, repetition_penalty=1.1))
