"""Reference PTD generation over any tree-forward model: the oracle for the vLLM integration.

Each step verifies the layout with the rule the engine ships (`core.verify.verify_walk`): at
each row on the walk the token plain decoding would commit there, chosen by the same `_pick`
as `generate_autoregressive` (the argmax, or one draw from the row's processed distribution
with the request's generator), so greedy output equals plain decoding's and a seeded sampled
request commits what plain decoding with the same seed commits, up to float differences
between the tree pass and the one-token passes.

A model is anything with `new_cache()`, `forward(token_ids, positions, attention_mask, cache)
-> logits [n, V]` (attention_mask: bool [n, n] over the new block, the cached prefix fully
visible; the block's KV is appended) and `compact(cache, num_new, keep)`. `HFTreeModel` adapts
Hugging Face Llama-architecture models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from vllm_ptd.config import PTDConfig
from vllm_ptd.core.metrics import PTDStats
from vllm_ptd.core.request_state import PTDRequestState
from vllm_ptd.core.verify import processed_probs, verify_walk


class TreeForwardModel(Protocol):
    def new_cache(self) -> Any: ...

    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Any,
    ) -> torch.Tensor: ...

    def compact(self, cache: Any, num_new: int, keep: Sequence[int]) -> None: ...


@dataclass
class Sampling:
    """temperature 0 = greedy."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


@dataclass
class GenerationResult:
    tokens: list[int]  # generated tokens (a final stop token included)
    stats: PTDStats = field(default_factory=PTDStats)


def _prefill(model: TreeForwardModel, prompt: Sequence[int]) -> tuple[Any, int, int]:
    """Cache the prompt except its last token, which plays x in the first step."""
    if len(prompt) < 1:
        raise ValueError("empty prompt")
    cache = model.new_cache()
    n = len(prompt) - 1
    if n > 0:
        causal = torch.from_numpy(np.tri(n, dtype=bool))   # torch's tril_ wakes its threads
        model.forward(torch.tensor(prompt[:-1]), torch.arange(n), causal, cache)
    return cache, int(prompt[-1]), n


def _pick(logits: torch.Tensor, sampling: Sampling, gen: torch.Generator) -> int:
    """The token plain decoding commits after one row of logits [V]: one draw per call."""
    if sampling.temperature <= 0.0:
        return int(logits.argmax())
    q = processed_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    return int(torch.multinomial(q, 1, generator=gen).item())


def generate_autoregressive(
    model: TreeForwardModel,
    prompt: Sequence[int],
    max_new_tokens: int,
    stop_token_ids: frozenset[int] = frozenset(),
    sampling: Sampling | None = None,
) -> list[int]:
    """Plain decoding through the same adapter: one token per forward pass."""
    sampling = sampling or Sampling()
    gen = torch.Generator().manual_seed(sampling.seed)
    cache, x, p = _prefill(model, prompt)
    out: list[int] = []
    one = torch.ones(1, 1, dtype=torch.bool)
    while len(out) < max_new_tokens:
        logits = model.forward(torch.tensor([x]), torch.tensor([p]), one, cache)[0]
        x = _pick(logits, sampling, gen)
        p += 1
        out.append(x)
        if x in stop_token_ids:
            break
    return out


def generate_ptd(
    model: TreeForwardModel,
    prompt: Sequence[int],
    max_new_tokens: int,
    config: PTDConfig | None = None,
    stop_token_ids: frozenset[int] = frozenset(),
    sampling: Sampling | None = None,
) -> GenerationResult:
    """Full PTD generation for one request; stats give DE, HR, AL, C and T nodes per step."""
    sampling = sampling or Sampling()
    config = config or PTDConfig()
    gen = torch.Generator().manual_seed(sampling.seed)
    state = PTDRequestState(config, prompt, stop_token_ids)
    cache, x, p = _prefill(model, prompt)
    out: list[int] = []
    committed: list[int] = []  # x is the prompt's last token: already in the context
    while len(out) < max_new_tokens and not (out and out[-1] in stop_token_ids):
        layout = state.propose(x, committed=committed)
        n = len(layout)
        logits = model.forward(
            torch.from_numpy(layout.tokens),
            torch.from_numpy(p + layout.depths.astype(np.int64)),
            torch.from_numpy(layout.ancestor_mask()),
            cache,
        )
        argmax = logits.argmax(-1).numpy()
        res = verify_walk(layout, lambda row, rows=logits: _pick(rows[row], sampling, gen),
                          stop_token_ids, max_new_tokens - len(out))
        model.compact(cache, n, [0, *res.accepted])
        state.observe(layout, argmax, res)
        out.extend(res.tokens)
        p += 1 + len(res.accepted)
        x = res.bonus
        committed = res.tokens
    return GenerationResult(tokens=out, stats=state.stats)
