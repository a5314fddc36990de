"""Which requests PTD drafts for. A request that cannot be verified exactly gets no drafts
(plain decoding for that step), never a silently different output."""

from __future__ import annotations

# vLLM treats temperatures below this as greedy (vllm.sampling_params._SAMPLING_EPS).
_GREEDY_EPS = 1e-5


def draft_blocker(params) -> str | None:
    """The reason this request gets no drafts, or None when PTD may draft for it."""
    if params is None:
        return "no sampling params (pooling request)"
    if params.temperature >= _GREEDY_EPS:
        return "sampling (temperature > 0) is not verified by PTD yet"
    if getattr(params, "structured_outputs", None) is not None:
        return "structured output: grammars validate drafts as a linear sequence"
    if params.logprobs is not None:
        return "logprobs are not produced for tree-verified tokens yet"
    if params.logit_bias or params.allowed_token_ids or params.bad_words:
        return "logit bias / allowed / banned tokens change the argmax"
    if (params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
            or params.repetition_penalty != 1.0):
        return "penalties depend on the tokens inside an accepted path"
    if params.min_tokens:
        return "min_tokens masks stop tokens inside an accepted path"
    if getattr(params, "logits_processors", None):
        return "custom logits processors"
    return None
