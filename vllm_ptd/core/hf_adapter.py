"""Adapter exposing a Hugging Face causal LM (Llama architecture) as a tree-forward model.

One request, batch 1, a `DynamicCache` of committed tokens. Each call appends the KV of a block of
new tokens; `compact` then keeps the accepted rows of that block, moved into contiguous slots
(KV compaction, as vLLM does it). Order-safe: kept rows are increasing, so each target slot is at
or before its source row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class HFTreeModel:
    """`forward(token_ids, positions, attention_mask, cache) -> logits` over an HF model."""

    def __init__(self, model: Any):
        self.model = model.eval()
        self.dtype = next(model.parameters()).dtype

    @classmethod
    def from_pretrained(cls, path: str, dtype: torch.dtype = torch.float32) -> HFTreeModel:
        from transformers import AutoModelForCausalLM

        # sdpa and eager both accept the additive 4D mask passed in forward().
        return cls(AutoModelForCausalLM.from_pretrained(path, dtype=dtype))

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache()

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Any,
    ) -> torch.Tensor:
        """token_ids, positions: int64 [n]; attention_mask: bool [n, n], query i sees new token j
        (every cached token is visible to every query). Appends the block's KV to `cache`.
        Returns float logits [n, V]."""
        n = int(token_ids.shape[0])
        past = cache.get_seq_length()
        neg = torch.finfo(self.dtype).min
        mask = torch.full((1, 1, n, past + n), neg, dtype=self.dtype)
        mask[..., :past] = 0.0
        mask[0, 0, :, past:].masked_fill_(attention_mask, 0.0)
        out = self.model(
            input_ids=token_ids.view(1, n),
            position_ids=positions.view(1, n),
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
        )
        return out.logits[0]

    def compact(self, cache: Any, num_new: int, keep: Sequence[int]) -> None:
        """Of the last `num_new` cache rows keep rows `keep` (increasing, block-relative), moved
        to the front of the block; drop the others."""
        total = cache.get_seq_length()
        past = total - num_new
        if list(keep) == list(range(len(keep))):  # the accepted rows are already in place
            if len(keep) < num_new:
                cache.crop(-(num_new - len(keep)))
            return
        idx = torch.cat([torch.arange(past), past + torch.as_tensor(list(keep), dtype=torch.long)])
        for layer in cache.layers:
            layer.keys = layer.keys.index_select(-2, idx)
            layer.values = layer.values.index_select(-2, idx)
