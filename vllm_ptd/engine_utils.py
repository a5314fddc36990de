"""Small helpers shared by the demo, benchmarks and engine tests: build an offline LLM on the
embedded model with settings that suit these CPU machines, and read PTD's acceptance counters."""

from __future__ import annotations

import os
from typing import Any


def make_llm(model: str | None = None, ptd: dict | None = None, dtype: str = "float32",
             max_model_len: int = 2048, speculative_config: dict | None = None,
             **kwargs: Any):
    """An offline `vllm.LLM`; `ptd` is the PTD speculative config (None: plain decoding).
    `speculative_config` passes another vLLM method (e.g. ngram) through instead."""
    from vllm import LLM

    from vllm_ptd.model import default_model_path

    # On CPU the KV cache size comes from this variable; vLLM's default fraction of RAM fails
    # on a shared machine.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    spec = speculative_config if ptd is None else {"method": "ptd", **ptd}
    return LLM(
        model or default_model_path(),
        dtype=dtype,
        max_model_len=max_model_len,
        seed=0,
        enforce_eager=kwargs.pop("enforce_eager", True),
        speculative_config=spec,
        disable_log_stats=kwargs.pop("disable_log_stats", False),
        **kwargs,
    )


def accepted_tokens(llm) -> int:
    """vLLM's spec-decode counter of accepted draft tokens (0 without speculation)."""
    total = 0
    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_accepted_tokens":
            total += int(getattr(metric, "value", 0))
    return total


def chat_prompts(llm, questions: list[str]) -> list[str]:
    """Apply the model's chat template to single-turn questions."""
    tok = llm.get_tokenizer()
    return [
        tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                add_generation_prompt=True)
        for q in questions
    ]
