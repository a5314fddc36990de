"""CPU attention backend that understands PTD trees.

Rows without a tree keep vLLM's native CPU kernel (`cpu_attention_with_kv_cache`, causal).
A step that carries trees runs that kernel only when some rows are outside every tree, then
recomputes the tree rows with masked attention over the paged KV in PyTorch: the committed
prefix fully visible, the block's own tokens per the tree mask. The step's trees come on
vLLM's attention metadata (`tree_of`).

Every layer of a step sees the same block tables, sequence lengths and masks, so a
`TreeStepPlan` is built once per step: flat gather indices into a layer's KV tensor (through
the probed packing, see cpu_kv_layout), padded over the step's tree blocks, and an additive
mask. Each layer then costs a fixed handful of tensor ops for all tree blocks together,
whatever their number: a gather of whole KV blocks, one permuting copy each for K and V, and
one fused `scaled_dot_product_attention` in the cache's dtype (bf16 stays bf16 with float32
accumulation, as in vLLM's own kernel; 0.38 ms per layer for a 25-row tree over 300 tokens,
against 0.53 for a float32 matmul and softmax).

Keys past a request's length inside its last block, and padding, are hidden by a -inf bias;
they must hold finite numbers, which vLLM guarantees (the KV cache is allocated zeroed and only
ever holds the model's K/V).

Steps with few tree blocks (at most MIRROR_MAX_BLOCKS) skip the gather: each block attends
through its request's unpacked mirror of the cache (cpu_kv_mirror), which only needs the few
positions committed since the last step: 0.28 -> 0.14 ms per layer for a 16-row tree over
300 tokens, 0.71 -> 0.32 ms over 1000 (benchmarks/bench_cpu_tree_attention.py); in bf16 and
fp16 a mirrored block runs vLLM's CPU extend kernel over the mirror, about half SDPA's time
again. With many blocks one padded SDPA call for all beats one call per block, so those
steps gather.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import torch
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

from vllm_ptd.attention.tree_metadata import (
    TreeAttentionMetadata,
    TreeBlock,
    tree_of,
)
from vllm_ptd.vllm_integration.cpu_kv_layout import (
    BlockLayout,
    SpanPermutation,
    flat_kv_index,
    probe_layout,
    span_permutation,
)
from vllm_ptd.vllm_integration.cpu_kv_mirror import (
    KVMirrorStore,
    MirroredBlock,
    block_bias,
    mirrored_attention,
)

# Steps with at most this many tree blocks attend through the requests' KV mirrors.
MIRROR_MAX_BLOCKS = 4


def _packing(layout: BlockLayout) -> tuple[SpanPermutation, SpanPermutation] | None:
    """K and V as token-major ([L, hs]) reorderings of a block-head span, when the probed
    packing allows it (every vLLM 0.32 CPU packing does); None falls back to flat gathers.
    Derived once per probed layout (see `_layout_and_packing`), not per step."""
    key = span_permutation(layout.key_index, token_major=True)
    value = span_permutation(layout.value_index, token_major=True)
    return None if key is None or value is None else (key, value)


@dataclass
class TreeStepPlan:
    """Gather indices and masks shared by every layer of one step (B tree blocks, padded to
    n query rows and L keys each)."""

    query_rows: torch.Tensor   # int64 [B * n]: batch row of each padded query
    out_rows: torch.Tensor     # int64 [R]: batch rows to write (the real ones)
    out_index: torch.Tensor    # int64 [R]: their position in the padded [B * n] order
    bias: torch.Tensor         # [B, 1, group * n, L], KV dtype: 0 visible, -inf hidden
    rows: int                  # n
    keys: int                  # L: whole blocks, so that K and V need no slicing
    packing: tuple[SpanPermutation, SpanPermutation] | None
    block_ids: torch.Tensor | None    # int64 [B * blocks]: whole KV blocks to gather
    key_index: torch.Tensor | None    # int64 [B, kv_heads, L, head_size]: flat gather (no
    value_index: torch.Tensor | None  # int64 [B, kv_heads, L, head_size]   plain packing)
    # Work buffers reused by every layer of the step: fresh allocations of this size cost
    # page faults on every layer, more than the arithmetic.
    scratch: dict[str, torch.Tensor] = field(default_factory=dict)

    def buffer(self, name: str, shape, dtype: torch.dtype) -> torch.Tensor:
        buf = self.scratch.get(name)
        if buf is None or buf.shape != tuple(shape) or buf.dtype != dtype:
            buf = self.scratch[name] = torch.empty(shape, dtype=dtype)
        return buf


@lru_cache(maxsize=16)
def _layout_and_packing(isa: str, dtype: torch.dtype, block_size: int, head_size: int
                        ) -> tuple[BlockLayout, tuple[SpanPermutation, SpanPermutation] | None]:
    layout = probe_layout(isa, dtype, block_size, head_size)
    return layout, _packing(layout)


def build_step_plan(blocks: list[TreeBlock], seq_lens: torch.Tensor,
                    block_table: torch.Tensor, kv_shape: torch.Size, layout: BlockLayout,
                    group: int, packing: tuple[SpanPermutation, SpanPermutation] | None,
                    dtype: torch.dtype) -> TreeStepPlan:
    """packing: `_packing(layout)`, or None to gather through flat element indices; dtype:
    the attention's compute dtype (the KV cache's)."""
    _, num_kv_heads, block_size, two_hs = kv_shape
    head_size = two_hs // 2
    n = max(b.size for b in blocks)
    lens = [int(seq_lens[b.req_index]) for b in blocks]
    num = len(blocks)
    max_blocks = -(-max(lens) // block_size)
    width = max_blocks * block_size

    bias = torch.zeros(num, 1, group * n, width, dtype=torch.float32)
    query_rows = torch.empty(num, n, dtype=torch.int64)
    block_ids = torch.empty(num, max_blocks, dtype=torch.int64)
    out_rows, out_index, flat_indices = [], [], []
    for b, (blk, length) in enumerate(zip(blocks, lens)):
        ids = block_table[blk.req_index, : -(-length // block_size)].long()
        # Padding repeats the request's own first block and first query: finite data that
        # the -inf bias hides and that is never written back.
        block_ids[b] = ids[0]
        block_ids[b, : ids.numel()] = ids
        bias[b] = block_bias(blk.mask, length - blk.size, group, torch.float32, rows=n,
                             width=width)[0]
        query_rows[b] = blk.start
        query_rows[b, : blk.size] = torch.arange(blk.start, blk.start + blk.size)
        out_rows.append(torch.arange(blk.start, blk.start + blk.size))
        out_index.append(torch.arange(b * n, b * n + blk.size))
        if packing is None:
            flat_indices.append(flat_kv_index(block_ids[b], 0, width, layout, num_kv_heads,
                                              block_size, head_size))
    key_index = value_index = None
    if packing is None:
        key_index = torch.stack([index[0] for index in flat_indices])
        value_index = torch.stack([index[1] for index in flat_indices])
    return TreeStepPlan(query_rows.view(-1), torch.cat(out_rows), torch.cat(out_index),
                        bias.to(dtype), n, width, packing, block_ids.view(-1), key_index,
                        value_index)


@dataclass
class StepPlans:
    """How one step's tree blocks attend: through their mirrors, or gathered together."""

    layout: BlockLayout
    mirrored: list[MirroredBlock]
    gathered: TreeStepPlan | None


def _step_plans(tree: TreeAttentionMetadata, attn_metadata, kv_cache, isa, group
                ) -> StepPlans:
    """The plans of this step; built by the first layer, kept on the step's tree metadata
    for the others."""
    key = ("cpu", tuple(kv_cache.shape), group)
    if key in tree.plans:
        return tree.plans[key]
    _, _, block_size, two_hs = kv_cache.shape
    layout, packing = _layout_and_packing(isa, kv_cache.dtype, block_size, two_hs // 2)
    mirrored, rest = _mirror_blocks(tree, attn_metadata, kv_cache, group)
    gathered = None
    if rest:
        gathered = build_step_plan(rest, attn_metadata.seq_lens, attn_metadata.block_table,
                                   kv_cache.shape, layout, group, packing, kv_cache.dtype)
    plans = tree.plans[key] = StepPlans(layout, mirrored, gathered)
    return plans


def _mirror_blocks(tree: TreeAttentionMetadata, attn_metadata, kv_cache, group
                   ) -> tuple[list[MirroredBlock], list[TreeBlock]]:
    """The blocks that attend through their request's mirror this step, and the rest."""
    store = tree.kv_mirrors
    if not isinstance(store, KVMirrorStore) or len(tree.blocks) > MIRROR_MAX_BLOCKS:
        return [], list(tree.blocks)
    _, num_kv_heads, block_size, two_hs = kv_cache.shape
    per_token = 2 * num_kv_heads * (two_hs // 2) * kv_cache.element_size()
    mirrored, rest = [], []
    for blk in tree.blocks:
        length = int(attn_metadata.seq_lens[blk.req_index])
        mirror = None if blk.req_id is None else store.reserve(blk.req_id, length, per_token)
        if mirror is None:
            rest.append(blk)
            continue
        row = attn_metadata.block_table[blk.req_index, : -(-length // block_size)].long()
        mirrored.append(MirroredBlock(mirror, blk.start, blk.size, length - blk.size, length,
                                      row, block_bias(blk.mask, length - blk.size, group,
                                                      kv_cache.dtype)))
    return mirrored, rest


def _gather_kv(kv_cache: torch.Tensor, plan: TreeStepPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V, both [B, H, L, hs] in the cache's dtype, of every planned block."""
    _, num_kv_heads, block_size, two_hs = kv_cache.shape
    head_size = two_hs // 2
    num, width = plan.bias.shape[0], plan.keys
    if plan.packing is None:
        flat = kv_cache.view(-1)
        return torch.take(flat, plan.key_index), torch.take(flat, plan.value_index)
    # Whole blocks are one contiguous copy each; one permuting copy per K and V then
    # unpacks them.
    spans = plan.buffer("spans", (plan.block_ids.numel(), *kv_cache.shape[1:]), kv_cache.dtype)
    torch.index_select(kv_cache, 0, plan.block_ids, out=spans)
    spans = spans.view(num, -1, num_kv_heads, 2, block_size * head_size)
    key_perm, value_perm = plan.packing
    k = _unpack(plan, "k", spans[:, :, :, 0], key_perm)
    v = _unpack(plan, "v", spans[:, :, :, 1], value_perm)
    return (k.view(num, num_kv_heads, width, head_size),
            v.view(num, num_kv_heads, width, head_size))


def _unpack(plan: TreeStepPlan, name: str, spans: torch.Tensor, perm: SpanPermutation
            ) -> torch.Tensor:
    """[B, nb, H, span] -> [B, H, nb, block_size, head_size] (token-major), contiguous."""
    num, nb, heads, _ = spans.shape
    view = spans.view(num, nb, heads, *perm.shape).permute(0, 2, 1, *[3 + a for a in perm.perm])
    return plan.buffer(name, view.shape, spans.dtype).copy_(view)


def tree_attention_rows(query: torch.Tensor, kv_cache: torch.Tensor, plan: TreeStepPlan,
                        num_kv_heads: int, scale: float) -> torch.Tensor:
    """Attention output of the plan's real rows: [R, num_heads * head_size] in the plan's
    dtype. One fused SDPA call for all tree blocks: in bf16 it accumulates in float32 and
    rounds the probabilities to bf16 before P @ V, like vLLM's own CPU kernel."""
    num, n = plan.bias.shape[0], plan.rows
    head_size = kv_cache.shape[3] // 2
    group = plan.bias.shape[2] // n
    q = query.view(query.shape[0], -1).index_select(0, plan.query_rows).to(plan.bias.dtype)
    q = q.view(num, n, num_kv_heads, group, head_size).permute(0, 2, 3, 1, 4)
    q = q.reshape(num, num_kv_heads, group * n, head_size)
    k, v = _gather_kv(kv_cache, plan)
    k, v = k.to(plan.bias.dtype), v.to(plan.bias.dtype)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=plan.bias,
                                                           scale=scale)  # [B, H, g*n, hs]
    out = out.view(num, num_kv_heads, group, n, head_size).permute(0, 3, 1, 2, 4)
    return out.reshape(num * n, -1).index_select(0, plan.out_index)


class CPUTreeAttentionImpl(CPUAttentionBackendImpl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        tree = tree_of(attn_metadata)
        if tree is None or not tree.blocks:
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                   output_scale, output_block_scale)
        # The KV write is a separate op in vLLM 0.32 (forward_includes_kv_cache_update is
        # False), so the tree rows' own K/V are already in the cache here.
        if sum(b.size for b in tree.blocks) < attn_metadata.num_actual_tokens:
            # Rows outside any tree (prefill chunks, plain decodes) need the native kernel.
            super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                            output_scale, output_block_scale)
        if self.sliding_window != -1 or self.alibi_slopes is not None or self.logits_soft_cap:
            raise ValueError("PTD tree attention does not support sliding window, ALiBi or "
                             "soft-capping on CPU")
        if self.is_fp8_kv_cache or self.sinks is not None:
            raise ValueError("PTD tree attention does not support fp8 KV cache or sinks on CPU")
        plans = _step_plans(tree, attn_metadata, kv_cache, layer.isa,
                            self.num_heads // self.num_kv_heads)
        # A layer that shares another layer's KV did not write its own key/value there.
        shared = getattr(layer, "kv_sharing_target_layer_name", None) is not None
        for blk in plans.mirrored:
            mirrored_attention(layer.layer_name, blk, query, None if shared else key,
                               None if shared else value, kv_cache, output, plans.layout,
                               self.scale)
        plan = plans.gathered
        if plan is not None:
            rows = tree_attention_rows(query, kv_cache, plan, self.num_kv_heads, self.scale)
            output.view(output.shape[0], -1).index_copy_(0, plan.out_rows,
                                                         rows.to(output.dtype))
        return output


class CPUTreeAttentionBackend(CPUAttentionBackend):
    @staticmethod
    def get_name() -> str:
        # Keep vLLM's name: parts of vLLM compare backend names (e.g. for the CPU platform).
        return CPUAttentionBackend.get_name()

    @staticmethod
    def get_impl_cls():
        return CPUTreeAttentionImpl
