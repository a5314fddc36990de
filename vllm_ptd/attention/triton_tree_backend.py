"""vLLM 0.32 Triton attention backend that adds PTD tree attention.

Subclasses vLLM's ``TRITON_ATTN`` backend (same name, KV layout and metadata builder).

Which rows use the tree kernel. A forward pass without tree metadata
(:func:`..tree_metadata.tree_of` is ``None``: prefill-only steps,
steps where no request drafted, profiling, CUDA-graph capture) runs vLLM's
``unified_attention`` untouched: for causal-only batches it is the better kernel (split-KV
"3D" path for long decode contexts, tuned tiles, CUDA-graph-friendly scratch) and PTD has
nothing to add. A pass with tree metadata runs the *whole* batch through
``vllm_ptd.kernels.tree_attention`` in one launch: tree requests per their masks, and
plain decode rows and prefill chunks of the same step (``is_tree == 0``) with a causal
in-block mask computed in the kernel, so they need no mask memory. The batch is not
split because vLLM interleaves those rows with the tree rows in ``query`` and the
metadata; two launches would need re-indexed sub-batches on every layer, for rows that
are a small share of a PTD step. (``unified_attention``'s ``qq_bias`` is one static
``[Q, Q]`` bias for the whole batch and cannot express per-request trees.)

CUDA graphs. A FULL graph replays the kernels captured without tree metadata, so it
would run causal attention on a tree step. The builder therefore reports
``UNIFORM_SINGLE_TOKEN_DECODE`` support when PTD is configured, and PTD makes a one-token
decode batch the engine's uniform decode batch (``vllm_integration/cuda_graphs.py``): steps
in which no request drafted replay vLLM's FULL decode graphs (a one-token batch is the same
under both kernels), steps with trees run piecewise graphs, where attention runs eagerly and
this forward sees the metadata. Without PTD the backend reports vLLM's own support, so
registering it costs other methods nothing.

Features the tree kernel lacks (sliding window, ALiBi, soft-capping, sinks, quantized
KV, encoder or chunked-local attention, PrefixLM ranges, non-causal or R-SWA steps)
still serve plain steps through vLLM; a tree step on such a layer raises ``ValueError``.

KV cache writes are unchanged: vLLM writes the block's K/V at the slots of the slot
mapping before attention (``do_kv_cache_update``), which is what the kernel expects.

The PTD integration registers this class for ``TRITON_ATTN`` on CUDA and selects that
backend when ``method`` is ``ptd`` (``vllm_ptd.vllm_integration``).
"""

import torch
from vllm.v1.attention.backend import AttentionCGSupport, AttentionLayer, AttentionType
from vllm.v1.attention.backends.triton_attn import (
    TritonAttentionBackend,
    TritonAttentionImpl,
    TritonAttentionMetadata,
    TritonAttentionMetadataBuilder,
)

from vllm_ptd.kernels import check_supported, tree_attention

from .tree_metadata import tree_of

_PREFIX = "PTD tree attention does not support: "


def ptd_configured(vllm_config) -> bool:
    """True when the engine's speculative config is PTD's (it carries ``ptd``)."""
    spec = getattr(vllm_config, "speculative_config", None)
    return getattr(spec, "ptd", None) is not None


class TritonTreeAttentionMetadataBuilder(TritonAttentionMetadataBuilder):
    """vLLM's Triton metadata builder; only its CUDA-graph claim changes under PTD."""

    @classmethod
    def get_cudagraph_support(cls, vllm_config, kv_cache_spec) -> AttentionCGSupport:
        if ptd_configured(vllm_config):
            # FULL graphs only for one-token decode batches, where tree == causal (PTD
            # declares those its uniform decode batch: vllm_integration/cuda_graphs.py).
            return AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
        return super().get_cudagraph_support(vllm_config, kv_cache_spec)


def _step_unsupported(attn_metadata: TritonAttentionMetadata) -> str | None:
    """Per-step features of vLLM's metadata that the tree kernel would drop."""
    causal = attn_metadata.causal
    if not isinstance(causal, bool) or not causal:
        return "non-causal or per-request causal flags"
    if attn_metadata.mm_prefix_range_tensor is not None:
        return "PrefixLM (bidirectional multimodal ranges)"
    if attn_metadata.rswa_prefix_lens is not None or attn_metadata.rswa_window:
        return "R-SWA"
    return None


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
            self.tree_unsupported = str(e).removeprefix(_PREFIX)

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
        tree = tree_of(attn_metadata)
        if tree is None:
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
        unsupported = self.tree_unsupported or _step_unsupported(attn_metadata)
        if unsupported is not None:
            raise ValueError(_PREFIX + unsupported)
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
            max_seq_len=attn_metadata.max_seq_len,
        )
        return output


class TritonTreeAttentionBackend(TritonAttentionBackend):
    """``TRITON_ATTN`` with PTD tree attention; same name, builder and KV layout."""

    # PTD steps on this backend pack their tree masks and move KV with the Triton
    # compaction (tree_metadata.uses_packed_tree_backend).
    ptd_packed_tree_masks = True

    @staticmethod
    def get_impl_cls() -> type[TritonTreeAttentionImpl]:
        return TritonTreeAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[TritonTreeAttentionMetadataBuilder]:
        return TritonTreeAttentionMetadataBuilder
