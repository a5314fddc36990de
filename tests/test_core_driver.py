"""The reference driver verifies with the engine's rule and is lossless, on a synthetic target.

The target's logits at a row depend only on the row's context (the cache, then the row's own
ancestors in the block), computed the same way in a tree pass and in a one-token pass, so the
tree forward and plain decoding see identical floats: greedy PTD must equal greedy decoding,
and a seeded sampled PTD run must commit exactly what plain sampling with that seed commits
(one draw per committed position). The law of sampled PTD is also checked against the target's
exact law. Fast: no model files (tests/test_core_reference_driver.py runs the embedded model).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from vllm_ptd.config import CHAIN, TREE, PTDConfig
from vllm_ptd.core.driver import Sampling, generate_autoregressive, generate_ptd
from vllm_ptd.core.metrics import PTDStats
from vllm_ptd.core.verify import processed_probs


class ContextTarget:
    """Logits at a row: a fixed function of the last `order` tokens of the row's context.
    A small vocabulary and peaked logits make the output repeat, so drafts get accepted."""

    def __init__(self, vocab: int = 8, order: int = 2, scale: float = 2.5, seed: int = 0):
        self.vocab, self.order, self.scale, self.seed = vocab, order, scale, seed
        self._rows: dict[tuple[int, ...], torch.Tensor] = {}

    def logits_after(self, context: tuple[int, ...]) -> torch.Tensor:
        key = context[-self.order:]
        if key not in self._rows:
            code = sum((t + 1) * 31**i for i, t in enumerate(key))
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + code)
            self._rows[key] = torch.randn(self.vocab, generator=gen) * self.scale
        return self._rows[key]

    def new_cache(self) -> list[int]:
        return []

    def forward(self, token_ids, positions, attention_mask, cache: list[int]) -> torch.Tensor:
        tokens = token_ids.tolist()
        rows = []
        for i in range(len(tokens)):
            path = [tokens[j] for j in range(len(tokens)) if attention_mask[i, j]]
            assert int(positions[i]) == len(cache) + len(path) - 1, "tree position off"
            rows.append(self.logits_after(tuple(cache + path)))
        cache.extend(tokens)
        return torch.stack(rows)

    def compact(self, cache: list[int], num_new: int, keep) -> None:
        block = cache[len(cache) - num_new:]
        del cache[len(cache) - num_new:]
        cache.extend(block[k] for k in keep)


PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 5, 6, 7, 5, 5, 6], [0, 3, 6, 1, 4, 7, 2, 5, 0, 3]]
CONFIGS = {"tree": PTDConfig(draft_shape=TREE, max_nodes=16, max_candidate_nodes=10),
           "chain": PTDConfig(draft_shape=CHAIN, max_nodes=8, context_min_ngram=1),
           "paper": PTDConfig(draft_shape=TREE, context_ngram=0, adaptive_budget=False)}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_greedy_ptd_commits_what_greedy_decoding_commits(config):
    target, total = ContextTarget(), PTDStats()
    for prompt in PROMPTS:
        plain = generate_autoregressive(target, prompt, 48, frozenset({7}))
        ptd = generate_ptd(target, prompt, 48, CONFIGS[config], frozenset({7}))
        assert ptd.tokens == plain
        total = total.merge(ptd.stats)
    assert total.DE > 1.2   # drafts were accepted: the walk went past x


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.7, top_k=4, top_p=0.9)],
                         ids=["t1", "filtered"])
def test_seeded_sampled_ptd_commits_what_seeded_plain_sampling_commits(config, sampling):
    """One draw per committed position with the request's generator, in commit order: the
    same random numbers as plain decoding, hence the same tokens."""
    target, total = ContextTarget(), PTDStats()
    for seed in range(6):
        for prompt in PROMPTS:
            s = Sampling(sampling.temperature, sampling.top_k, sampling.top_p, seed)
            plain = generate_autoregressive(target, prompt, 32, sampling=s)
            ptd = generate_ptd(target, prompt, 32, CONFIGS[config], sampling=s)
            assert ptd.tokens == plain, (seed, prompt)
            total = total.merge(ptd.stats)
    assert total.DE > 1.1


L = 3       # the law of the first L generated tokens is compared
RUNS = 2000


def exact_law(target: ContextTarget, prompt: list[int], temperature: float
              ) -> dict[tuple[int, ...], float]:
    law = {(): 1.0}
    for _ in range(L):
        law = {seq + (t,): p * float(q[t])
               for seq, p in law.items()
               for q in [processed_probs(target.logits_after(tuple(prompt) + seq), temperature)]
               for t in range(target.vocab)}
    return law


def law_pvalue(runs: int) -> tuple[float, PTDStats]:
    """Chi-square p-value of the first L tokens of `runs` sampled PTD runs (seeds 0, 1, ...)
    against the target's exact law, and the runs' counters."""
    target = ContextTarget(vocab=4, scale=2.0, seed=1)
    prompt = [0, 1] + generate_autoregressive(target, [0, 1], 10)   # a context that predicts
    config = PTDConfig(max_nodes=12, max_candidate_nodes=8, context_min_ngram=1)
    counts: Counter = Counter()
    total = PTDStats()
    for seed in range(runs):
        res = generate_ptd(target, prompt, L, config, sampling=Sampling(1.0, seed=seed))
        counts[tuple(res.tokens)] += 1
        total = total.merge(res.stats)
    law = exact_law(target, prompt, 1.0)
    assert set(counts) <= set(law)
    support = sorted(law)
    obs = np.array([counts[s] for s in support], dtype=float)
    exp = np.array([law[s] for s in support]) * runs
    rare = exp < 5   # pooled: the chi-square approximation needs expected counts >= 5
    obs = np.append(obs[~rare], obs[rare].sum())
    exp = np.append(exp[~rare], exp[rare].sum())
    return float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue), total


def test_sampled_ptd_has_the_targets_law():
    """Over unrelated seeds the first L tokens follow the target's exact law, while most of
    them are committed through accepted drafts (the tree rule, not plain steps, is tested)."""
    pvalue, total = law_pvalue(RUNS)
    assert total.tokens > 1.5 * total.steps
    # Seeded, so deterministic; 1e-4 as in tests/test_core_verify.py.
    assert pvalue > 1e-4


def test_the_law_check_rejects_a_walk_that_redraws_on_a_miss(monkeypatch):
    """Teeth: the same check fails for a biased rule, one that draws a second time at a row
    when the first draw matched no child (it accepts drafts too often)."""
    from vllm_ptd.core import driver
    from vllm_ptd.core.verify import candidate_children, verify_walk

    def second_chance_walk(layout, token_at_row, stop_token_ids, max_new):
        kids = candidate_children(layout)

        def biased(row):
            tok = token_at_row(row)
            if kids.get(row) and all(layout.tokens[c] != tok for c in kids[row]):
                tok = token_at_row(row)
            return tok

        return verify_walk(layout, biased, stop_token_ids, max_new)

    monkeypatch.setattr(driver, "verify_walk", second_chance_walk)
    pvalue, _ = law_pvalue(RUNS // 4)   # p ~ 1e-36 at this size: a quarter of the runs do
    assert pvalue < 1e-6
