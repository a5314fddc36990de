"""Reference driver on the embedded model (HF adapter, float32): greedy PTD == greedy decoding."""

from __future__ import annotations

import pytest
import torch

from vllm_ptd.config import PTDConfig
from vllm_ptd.core.driver import Sampling, generate_autoregressive, generate_ptd
from vllm_ptd.core.metrics import PTDStats

pytestmark = pytest.mark.model

NEW_TOKENS = 64


@pytest.fixture(scope="module")
def model_and_tokenizer():
    from transformers import AutoTokenizer

    from vllm_ptd.core.hf_adapter import HFTreeModel
    from vllm_ptd.model import default_model_path

    path = default_model_path()
    return HFTreeModel.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(
        path
    )


def chat_ids(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    if not isinstance(ids, list):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def prompts() -> list[str]:
    from vllm_ptd.datasets import sample_prompts

    return [
        p for name in ("mt_bench", "gsm8k", "humaneval", "mbpp") for p in sample_prompts(name, 2)
    ]


def test_greedy_ptd_equals_greedy_decoding_on_real_prompts(model_and_tokenizer):
    model, tok = model_and_tokenizer
    stop = frozenset({tok.eos_token_id})
    total = PTDStats()
    texts = prompts()
    assert len(texts) == 8
    for text in texts:
        ids = chat_ids(tok, text)
        plain = generate_autoregressive(model, ids, NEW_TOKENS, stop)
        ptd = generate_ptd(model, ids, NEW_TOKENS, PTDConfig(), stop)
        assert ptd.tokens == plain, text[:60]
        total = total.merge(ptd.stats)
    assert total.DE > 1.0


def test_sampled_ptd_runs_and_respects_max_new_tokens(model_and_tokenizer):
    model, tok = model_and_tokenizer
    ids = chat_ids(tok, "Write a short poem about the sea.")
    res = generate_ptd(
        model, ids, 24, PTDConfig(), frozenset({tok.eos_token_id}), Sampling(0.8, 50, 0.95, 3)
    )
    assert 1 <= len(res.tokens) <= 24
    assert res.stats.steps <= len(res.tokens)
