"""Verification of the candidate tree C against the target (ptd_algorithm.md step 3).

Only C rows (1..num_candidates) can be accepted; T rows never are. Result convention, for every
outcome: `tokens == [layout.tokens[i] for i in accepted] + [bonus]`. The KV of x and of the
`accepted` rows is what the engine keeps; `bonus` is the next x (its KV comes next step). When a
stop token or the max_new limit falls inside the accepted path, the path is cut there and the
token at the cut becomes the bonus, so `tokens` ends at (and includes) the first stop token and
`len(tokens) <= max_new`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vllm_ptd.core.layout import TreeLayout


@dataclass
class VerifyResult:
    accepted: list[int]  # layout rows of accepted C nodes, in path order (increasing)
    tokens: list[int]  # committed tokens: accepted path tokens, then the bonus
    bonus: int  # tokens[-1], the next x


def candidate_children(layout: TreeLayout) -> dict[int, list[int]]:
    """Row -> C child rows in layout order, for x and the C rows."""
    children: dict[int, list[int]] = {}
    parents = layout.parents
    for i in range(1, layout.num_candidates + 1):
        children.setdefault(int(parents[i]), []).append(i)
    return children


def _finish(accepted: list[int], tokens: list[int]) -> VerifyResult:
    return VerifyResult(accepted=accepted, tokens=tokens, bonus=tokens[-1])


def _must_stop(tok: int, n_tokens: int, stop: frozenset[int], max_new: int | None) -> bool:
    return tok in stop or (max_new is not None and n_tokens >= max_new)


def verify_greedy(
    layout: TreeLayout,
    argmax: np.ndarray,
    stop_token_ids: frozenset[int] = frozenset(),
    max_new: int | None = None,
) -> VerifyResult:
    """Greedy: follow the child whose token is the target's argmax at the current row.

    argmax: int64 [n], the target argmax at each layout row (only x and C rows are read); or
    any object whose `argmax[row]` gives that row's choice (read only along the path).
    """
    if max_new is not None and max_new < 1:
        raise ValueError(f"max_new must be >= 1, got {max_new}")
    children = candidate_children(layout)
    ltokens = layout.tokens
    accepted: list[int] = []
    tokens: list[int] = []
    cur = 0
    while True:
        nxt = int(argmax[cur])
        tokens.append(nxt)
        if _must_stop(nxt, len(tokens), stop_token_ids, max_new):
            return _finish(accepted, tokens)
        for c in children.get(cur, ()):
            if ltokens[c] == nxt:
                accepted.append(c)
                cur = c
                break
        else:
            return _finish(accepted, tokens)


def verify_sampled(
    layout: TreeLayout,
    probs: torch.Tensor,
    generator: torch.Generator | None,
    stop_token_ids: frozenset[int] = frozenset(),
    max_new: int | None = None,
) -> VerifyResult:
    """Exact stochastic verification (the corrected rule).

    At the current row with target distribution q, try the C children in order: accept child c
    with probability q(c) / (mass not yet rejected); on rejection q(c) is zeroed (the
    renormalisation is implicit in the division). On acceptance descend into c. At a leaf, or
    when every child is rejected, the bonus is SAMPLED from the residual q, never its argmax.
    For deterministic drafts each committed token is then distributed exactly as q.

    probs: float [n, V], rows already processed (temperature / top-k / top-p) and normalised;
    or any object whose `probs[row]` gives that row (rows are read only along the path).
    """
    if max_new is not None and max_new < 1:
        raise ValueError(f"max_new must be >= 1, got {max_new}")
    children = candidate_children(layout)
    ltokens = layout.tokens
    accepted: list[int] = []
    tokens: list[int] = []
    cur = 0
    while True:
        kids = children.get(cur, [])
        chosen = -1
        rejected: list[int] = []
        if kids:
            kid_tokens = [int(ltokens[c]) for c in kids]
            q_kids = probs[cur][kid_tokens].double().tolist()
            u = torch.rand(len(kids), generator=generator, dtype=torch.float64).tolist()
            remaining = 1.0
            for c, tok, qc, uc in zip(kids, kid_tokens, q_kids, u):
                if tok in rejected:  # a duplicate child token: its mass is already zero
                    continue
                # remaining <= qc: the rest of the mass sits on this child (guards rounding)
                if remaining <= qc or uc * remaining < qc:
                    chosen = c
                    break
                rejected.append(tok)
                remaining -= qc
        if chosen >= 0:
            tok = int(ltokens[chosen])
            tokens.append(tok)
            if _must_stop(tok, len(tokens), stop_token_ids, max_new):
                return _finish(accepted, tokens)
            accepted.append(chosen)
            cur = chosen
            continue
        q = probs[cur]
        if rejected:
            q = q.clone()
            q[rejected] = 0.0
            if float(q.sum()) <= 0.0:  # all mass rejected by rounding; fall back to the row
                q = probs[cur]
        bonus = int(torch.multinomial(q.float(), 1, generator=generator).item())
        tokens.append(bonus)
        return _finish(accepted, tokens)


def processed_probs(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """Target distribution per row after temperature, then top-k, then top-p (vLLM's order).

    temperature == 0 means greedy: a one-hot at the argmax. top_k <= 0 and top_p >= 1 disable
    those filters. Returns float32 [..., V] rows summing to 1.
    """
    logits = logits.float()
    if temperature <= 0.0:
        out = torch.zeros_like(logits)
        out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        return out
    logits = logits / temperature
    V = logits.shape[-1]
    if 0 < top_k < V:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # drop a token when the mass strictly before it already reaches top_p (keeps >= 1)
        drop = (sorted_probs.cumsum(-1) - sorted_probs) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, idx, sorted_logits)
    return logits.softmax(-1)
