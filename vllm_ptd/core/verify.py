"""Verification of the candidate tree C against the target: one rule, greedy or sampled.

At each row on the walk, starting at x, take the token plain decoding would commit after that
row's path: the (processed) argmax when greedy; when sampling, one token drawn from the row's
exact distribution with the request's generator. Follow the C child holding that token; when
no child holds it, that token is the bonus and the walk ends. Every committed token is thus
chosen exactly as plain decoding chooses it, one choice (one draw) per committed position, so
greedy output equals plain greedy decoding and sampled output has plain sampling's law (a
seeded request even draws the same random numbers). At each row some child is accepted with
the target's probability of the children's tokens (their sum), as under the sequential
accept/reject rule, which draws more random numbers per committed position.

Only C rows (1..num_candidates) can be accepted; T rows never are. Result convention, for every
outcome: `tokens == [layout.tokens[i] for i in accepted] + [bonus]`. The KV of x and of the
`accepted` rows is what the engine keeps; `bonus` is the next x (its KV comes next step). When a
stop token or the max_new limit falls inside the accepted path, the path is cut there and the
token at the cut becomes the bonus, so `tokens` ends at (and includes) the first stop token and
`len(tokens) <= max_new`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


def verify_walk(
    layout: TreeLayout,
    token_at_row: Callable[[int], int],
    stop_token_ids: frozenset[int] = frozenset(),
    max_new: int | None = None,
) -> VerifyResult:
    """The walk of the module docstring. `token_at_row(row)` is the token committed at that
    row (x is row 0); it is called once per committed token, for the rows on the walk only,
    in walk order, so a sampler may draw there."""
    if max_new is not None and max_new < 1:
        raise ValueError(f"max_new must be >= 1, got {max_new}")
    children = candidate_children(layout)
    ltokens = layout.tokens
    accepted: list[int] = []
    tokens: list[int] = []
    row = 0
    while True:
        tok = int(token_at_row(row))
        tokens.append(tok)
        if tok in stop_token_ids or (max_new is not None and len(tokens) >= max_new):
            break
        row = next((c for c in children.get(row, ()) if ltokens[c] == tok), -1)
        if row < 0:
            break
        accepted.append(row)
    return VerifyResult(accepted=accepted, tokens=tokens, bonus=tokens[-1])


def verify_greedy(
    layout: TreeLayout,
    argmax: Any,
    stop_token_ids: frozenset[int] = frozenset(),
    max_new: int | None = None,
) -> VerifyResult:
    """`verify_walk` with each row's token given as `argmax[row]`: an int array [n] (the
    target's argmax; only x and C rows are read), or any object indexed by row, such as the
    engine's rows drawn on first read (`TreeRowDistributions.sampled`)."""
    return verify_walk(layout, argmax.__getitem__, stop_token_ids, max_new)


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
