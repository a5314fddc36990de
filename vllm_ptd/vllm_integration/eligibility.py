"""Which requests PTD drafts for. A request whose tree cannot be verified exactly gets no
drafts (plain decoding), never a silently different output.

Drafts: greedy and sampled requests, with temperature, top-k, top-p, min-p, repetition /
presence / frequency penalties, logit bias, allowed tokens, banned words, min_tokens, seeds
(tree_sampling.py builds each tree row's distribution as vLLM's Sampler would).
No drafts: the settings below.
"""

from __future__ import annotations


def draft_blocker(params) -> str | None:
    """The reason this request gets no drafts, or None when PTD may draft for it."""
    if params is None:
        return "no sampling params (pooling request)"
    if getattr(params, "structured_outputs", None) is not None:
        return "structured output: grammars validate drafts as a linear sequence"
    if params.logprobs is not None or getattr(params, "logprob_token_ids", None):
        return "logprobs are not produced for tree-verified tokens yet"
    if getattr(params, "logits_processors", None):
        return "custom logits processors"
    if getattr(params, "thinking_token_budget", None) is not None:
        return "thinking budgets count draft tokens as a linear sequence"
    return None
