"""Which requests PTD drafts for. A request whose tree cannot be verified exactly gets no
drafts (plain decoding), never a silently different output.

Drafts: greedy and sampled requests, with temperature, top-k, top-p, min-p, repetition /
presence / frequency penalties, logit bias, allowed tokens, banned words, min_tokens, seeds
(tree_sampling.py builds each tree row's distribution as vLLM's Sampler would), and
logprobs in vLLM's default raw modes (runner_patches gathers them at the verified rows).
No drafts: the settings below.
"""

from __future__ import annotations

# Engine logprobs modes in which tree-verified tokens get logprobs (of the raw logits).
RAW_LOGPROBS_MODES = ("raw_logprobs", "raw_logits")


def draft_blocker(params, raw_logprobs: bool = True) -> str | None:
    """The reason this request gets no drafts, or None when PTD may draft for it.

    raw_logprobs: the engine returns logprobs of the raw logits (vLLM's default), which PTD
    reproduces for tree-verified tokens; with processed logprobs, logprobs requests get none.
    """
    if params is None:
        return "no sampling params (pooling request)"
    if getattr(params, "structured_outputs", None) is not None:
        return "structured output: grammars validate drafts as a linear sequence"
    if params.logprobs is not None and not raw_logprobs:
        return "processed logprobs modes are not produced for tree-verified tokens"
    if getattr(params, "logprob_token_ids", None):
        return "logprobs of chosen token ids are not produced for tree-verified tokens"
    if getattr(params, "logits_processors", None):
        return "custom logits processors"
    if getattr(params, "thinking_token_budget", None) is not None:
        return "thinking budgets count draft tokens as a linear sequence"
    return None
