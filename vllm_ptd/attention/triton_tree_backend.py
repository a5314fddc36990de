"""vLLM 0.32 Triton attention backend that adds PTD tree attention.

Subclasses vLLM's ``TRITON_ATTN`` backend. A forward pass without tree metadata
(:func:`..tree_metadata.get_tree_attention_metadata` is ``None``: prefill-only or plain
steps, profiling, CUDA-graph capture of plain decode) runs vLLM's ``unified_attention``
untouched. A pass with tree metadata runs the whole batch through
``vllm_ptd.kernels.tree_attention`` in one launch: tree requests per their masks,
requests flagged non-tree with a causal in-block mask (see that module's docstring for
why mixed batches are not split).

KV cache writes are unchanged: vLLM writes the block's K/V at the slots of the slot
mapping before attention (``do_kv_cache_update``), which is what the kernel expects.

Register it on CUDA with ``register_backend(AttentionBackendEnum.TRITON_ATTN,
"vllm_ptd.attention.triton_tree_backend.TritonTreeAttentionBackend")`` (or select it
with ``--attention-backend``).
"""

import torch
from vllm.v1.attention.backend import AttentionLayer, AttentionType
from vllm.v1.attention.backends.triton_attn import (
    TritonAttentionBackend,
    TritonAttentionImpl,
    TritonAttentionMetadata,
)

from vllm_ptd.kernels import check_supported, tree_attention

from .tree_metadata import get_tree_attention_metadata


class TritonTreeAttentionImpl(TritonAttentionImpl):
    """``TritonAttentionImpl`` whose forward switches to tree attention on PTD steps."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Layers with features the tree kernel lacks still serve plain steps; a PTD
        # step on them must fail loudly rather than drop the feature.
        self.tree_unsupported: str | None = None
        try:
            check_supported(
                sliding_window=self.sliding_window,
                alibi_slopes=self.alibi_slopes,
                logits_soft_cap=self.logits_soft_cap,
                sinks=self.sinks,
                kv_cache_dtype=self.kv_cache_dtype,
            )
            if self.attn_type != AttentionType.DECODER:
                raise ValueError(f"attention type {self.attn_type}")
            if self.chunk_lookback != -1:
                raise ValueError("chunked local attention")
        except ValueError as e:
            self.tree_unsupported = str(e)

    def forward(
        self,
        layer: AttentionLayer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: TritonAttentionMetadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Tree attention when the step carries tree metadata, else vLLM's forward.

        Shapes as in ``TritonAttentionImpl.forward``: query/output
        ``[num_tokens, num_heads, head_size]``, kv_cache logical
        ``[num_blocks, num_kv_heads, block_size, 2 * head_size]``.
        """
        tree = get_tree_attention_metadata()
        if tree is None or attn_metadata is None:
            return super().forward(
                layer,
                query,
                key,
                value,
                kv_cache,
                attn_metadata,
                output,
                output_scale,
                output_block_scale,
            )
        if self.tree_unsupported is not None:
            raise ValueError(f"PTD tree attention: {self.tree_unsupported}")
        if output_scale is not None or output_block_scale is not None:
            raise ValueError("PTD tree attention does not support fused output quant")
        n = attn_metadata.num_actual_tokens
        # Same views as the parent: (B, H, N, 2*hs) -> K, V as (B, N, H, hs).
        key_cache, value_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
        tree_attention(
            query[:n],
            key_cache,
            value_cache,
            attn_metadata.block_table,
            attn_metadata.seq_lens,
            attn_metadata.query_start_loc,
            tree.mask_bits,
            tree.mask_words,
            self.scale,
            output[:n],
            max_query_len=attn_metadata.max_query_len,
            is_tree=tree.is_tree,
        )
        return output


class TritonTreeAttentionBackend(TritonAttentionBackend):
    """``TRITON_ATTN`` with PTD tree attention; same name, builder and KV layout."""

    @staticmethod
    def get_impl_cls() -> type[TritonTreeAttentionImpl]:
        return TritonTreeAttentionImpl
