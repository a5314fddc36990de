"""The target's next-token distribution at each verifiable tree row, built exactly as vLLM
0.32's `Sampler` builds it for plain decoding (vllm/v1/sample/sampler.py).

Row r (x, then the C rows) is the distribution plain decoding would sample from after
committing x and the C path down to r. So every step that depends on the history (penalties,
bad words, min_tokens) sees `output + path(r)`, where plain decoding's `output` already ends
with x. Steps, in the Sampler's order:
  float32; allowed-token mask; bad words; min_tokens; logit bias; penalties
  -> greedy requests take the argmax here;
  temperature; min_p; top-k / top-p -> softmax.
Sampled rows are drawn by vLLM's own top-k/top-p sampler with the request's generator, one
draw per committed position as in plain decoding (see runner_patches). Each step calls
vLLM's own function where one exists; min_tokens, logit bias and min_p
repeat the builtin logits processors' arithmetic, which lives in batch-indexed state that
cannot be evaluated for rows vLLM does not know about (tree nodes).
`tests/test_tree_sampling.py` checks every step against vLLM's Sampler on an InputBatch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from vllm.v1.sample.ops.bad_words import apply_bad_words
from vllm.v1.sample.ops.penalties import apply_all_penalties
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

from vllm_ptd.core.layout import TreeLayout

# vLLM treats temperatures below this as greedy (vllm.sampling_params._SAMPLING_EPS).
GREEDY_EPS = 1e-5


def is_greedy(params) -> bool:
    return params.temperature < GREEDY_EPS


def has_penalties(params) -> bool:
    return (params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
            or params.repetition_penalty != 1.0)


def alters_logits(params) -> bool:
    """True when vLLM's Sampler changes this request's logits before the argmax, so a tree
    cannot be verified from the raw argmax alone."""
    return bool(params.allowed_token_ids or params.bad_words_token_ids or params.min_tokens
                or params.logit_bias or has_penalties(params))


def verified_rows(layout: TreeLayout) -> int:
    """Rows whose distribution verification reads: x and the C rows (T is never accepted)."""
    return 1 + layout.num_candidates


def node_histories(layout: TreeLayout, output_token_ids: Sequence[int]) -> list[list[int]]:
    """The output history plain decoding would have at each verified row: the committed
    output (ending with x), then the C path from x down to that row (inclusive)."""
    rows = verified_rows(layout)
    parents = layout.parents.tolist()
    tokens = layout.tokens.tolist()
    out = list(output_token_ids)
    histories = [out]
    for r in range(1, rows):  # parents precede children: the parent's history is final
        histories.append(histories[parents[r]] + [tokens[r]])
    return histories


def apply_argmax_affecting(logits: torch.Tensor, params, prompt_token_ids: Sequence[int],
                           histories: list[list[int]]) -> torch.Tensor:
    """Sampler.apply_logits_processors for one request's rows (in place where vLLM is).

    logits: float32 [m, V], row r predicting the token after histories[r].
    """
    m, vocab = logits.shape
    if params.allowed_token_ids:
        banned = torch.ones(vocab, dtype=torch.bool, device=logits.device)
        banned[list(params.allowed_token_ids)] = False
        logits.masked_fill_(banned, float("-inf"))
    if params.bad_words_token_ids:
        apply_bad_words(logits, {r: params.bad_words_token_ids for r in range(m)}, histories)
    if params.min_tokens:
        stop = sorted(params.all_stop_token_ids)
        short = [r for r in range(m) if len(histories[r]) < params.min_tokens]
        if stop and short:
            rows = torch.tensor(short, device=logits.device).repeat_interleave(len(stop))
            cols = torch.tensor(stop, device=logits.device).repeat(len(short))
            logits.index_put_((rows, cols), torch.tensor(float("-inf"), device=logits.device))
    if params.logit_bias:
        cols = torch.tensor(list(params.logit_bias.keys()), device=logits.device)
        bias = torch.tensor(list(params.logit_bias.values()), dtype=torch.float32,
                            device=logits.device)
        logits[:, cols] += bias
    if has_penalties(params):
        prompt = torch.tensor([list(prompt_token_ids)] * m, dtype=torch.int64,
                              device=logits.device)
        if prompt.shape[1] == 0:  # vLLM pads prompts; an empty row needs one pad column
            prompt = torch.full((m, 1), vocab, dtype=torch.int64, device=logits.device)

        def per_row(value: float) -> torch.Tensor:
            return torch.full((m,), value, dtype=torch.float32, device=logits.device)

        logits = apply_all_penalties(logits, prompt, per_row(params.presence_penalty),
                                     per_row(params.frequency_penalty),
                                     per_row(params.repetition_penalty), histories)
    return logits


def scale_for_sampling(logits: torch.Tensor, params) -> torch.Tensor:
    """Sampler.sample's random branch before top-k / top-p: temperature, then min_p."""
    m = logits.shape[0]
    logits = logits.div_(torch.full((m, 1), params.temperature, dtype=torch.float32,
                                    device=logits.device))
    if params.min_p:
        probs = torch.nn.functional.softmax(logits, dim=-1)
        threshold = torch.amax(probs, dim=-1, keepdim=True).mul_(
            torch.tensor(params.min_p, dtype=torch.float32, device=logits.device))
        logits.masked_fill_(probs < threshold, float("-inf"))
    return logits


def top_k_top_p(params, rows: int, vocab: int, device: torch.device
                ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Per-row k and p tensors as vLLM's InputBatch holds them (None: filter unused)."""
    k = p = None
    if 0 < params.top_k < vocab:
        k = torch.full((rows,), params.top_k, dtype=torch.int32, device=device)
    if params.top_p < 1.0:
        p = torch.full((rows,), params.top_p, dtype=torch.float32, device=device)
    return k, p


RowSampler = Callable[[torch.Tensor, object], int]  # (scaled logits [V], params) -> token


class TreeRowDistributions:
    """One request's processed rows, each computed on first use: verification reads x and
    the rows along the path it accepts (about DE rows), not every C row.

    `argmax[r]` is the processed greedy choice at row r and `sampled[r]` one token drawn at
    row r by `sample_row` from `scaled_logits(r)` (drawn once, on first read); both index like
    the arrays core.verify expects. `probs[r]` (float32 [V]) is the distribution of that draw,
    for tests that check it against vLLM's Sampler or verify with another rule.
    """

    def __init__(self, raw_logits: torch.Tensor, layout: TreeLayout, params,
                 prompt_token_ids: Sequence[int], output_token_ids: Sequence[int],
                 sample_row: RowSampler | None = None):
        self.raw_logits = raw_logits
        self.sample_row = sample_row
        self._sampled: dict[int, int] = {}
        self.sampled = _RowView(self._sample)
        self.layout = layout
        self.params = params
        self.prompt_token_ids = list(prompt_token_ids)
        self.histories = node_histories(layout, output_token_ids)
        self._logits: dict[int, torch.Tensor] = {}
        self.argmax = _RowView(self._argmax)
        self.probs = _RowView(self._probs)

    def processed_logits(self, r: int) -> torch.Tensor:
        """float32 [V]: row r after everything before the greedy argmax."""
        if r not in self._logits:
            if not 0 <= r < len(self.histories):
                raise IndexError(f"row {r} is not x or a C row of this tree")
            row = self.raw_logits[r: r + 1].to(torch.float32, copy=True)
            self._logits[r] = apply_argmax_affecting(
                row, self.params, self.prompt_token_ids, [self.histories[r]])[0]
        return self._logits[r]

    def computed_argmax(self) -> dict[int, int]:
        """Processed argmax of every row computed so far (what drafting learns from)."""
        return {r: int(v.argmax()) for r, v in self._logits.items()}

    def _argmax(self, r: int) -> int:
        return int(self.processed_logits(r).argmax())

    def scaled_logits(self, r: int) -> torch.Tensor:
        """float32 [V]: row r as vLLM's sampler receives it before top-k / top-p (the
        processed logits after temperature and min_p)."""
        return scale_for_sampling(self.processed_logits(r).clone()[None], self.params)[0]

    def _probs(self, r: int) -> torch.Tensor:
        # vLLM's samplers (Gumbel-max or exponential races) draw exactly the softmax of the
        # filtered logits
        scaled = self.scaled_logits(r)[None]
        k, p = top_k_top_p(self.params, 1, scaled.shape[-1], scaled.device)
        return apply_top_k_top_p(scaled, k, p).softmax(dim=-1, dtype=torch.float32)[0]

    def _sample(self, r: int) -> int:
        if r not in self._sampled:
            if self.sample_row is None:
                raise ValueError("no row sampler was given")
            self._sampled[r] = int(self.sample_row(self.scaled_logits(r), self.params))
        return self._sampled[r]


class _RowView:
    def __init__(self, row):
        self._row = row

    def __getitem__(self, r: int):
        return self._row(int(r))
