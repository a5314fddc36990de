"""CPU attention backend that understands PTD trees.

Rows without a tree keep vLLM's native CPU kernel (`cpu_attention_with_kv_cache`, causal).
A PTD step runs that kernel for the whole batch, then recomputes the rows of each tree
block with masked attention over the paged KV in PyTorch: the committed prefix fully visible,
the block's own tokens per the tree mask. The native pass over tree rows is wasted work, but
it keeps every non-tree row bit-identical to plain vLLM without splitting the batch.
"""

from __future__ import annotations

import torch
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

from vllm_ptd.attention.tree_metadata import get_tree_attention_metadata
from vllm_ptd.vllm_integration.cpu_kv_layout import probe_layout, read_kv


class CPUTreeAttentionImpl(CPUAttentionBackendImpl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        output = super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                 output_scale, output_block_scale)
        tree = get_tree_attention_metadata()
        if tree is None or attn_metadata is None or not tree.blocks:
            return output
        if self.sliding_window != -1 or self.alibi_slopes is not None or self.logits_soft_cap:
            raise ValueError("PTD tree attention does not support sliding window, ALiBi or "
                             "soft-capping on CPU")
        if self.is_fp8_kv_cache or self.sinks is not None:
            raise ValueError("PTD tree attention does not support fp8 KV cache or sinks on CPU")
        _, _, block_size, two_hs = kv_cache.shape
        layout = probe_layout(layer.isa, kv_cache.dtype, block_size, two_hs // 2)
        seq_lens = attn_metadata.seq_lens
        block_table = attn_metadata.block_table
        for blk in tree.blocks:
            seq_len = int(seq_lens[blk.req_index])
            prefix = seq_len - blk.size
            positions = torch.arange(seq_len)
            slots = block_table[blk.req_index, positions // block_size].long() * block_size
            slots += positions % block_size
            k, v = read_kv(kv_cache, slots, layout)          # [L, kv_heads, hs]
            q = query[blk.start: blk.start + blk.size]        # [n, heads, hs]
            mask = torch.ones(blk.size, seq_len, dtype=torch.bool)
            mask[:, prefix:] = blk.mask
            group = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(group, dim=1).transpose(0, 1)   # [heads, L, hs]
            v = v.repeat_interleave(group, dim=1).transpose(0, 1)
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1).to(k.dtype), k, v, attn_mask=mask, scale=self.scale)
            output[blk.start: blk.start + blk.size] = out.transpose(0, 1).reshape(
                blk.size, -1).to(output.dtype) if output.dim() == 2 else out.transpose(0, 1)
        return output


class CPUTreeAttentionBackend(CPUAttentionBackend):
    @staticmethod
    def get_name() -> str:
        # Keep vLLM's name: parts of vLLM compare backend names (e.g. for the CPU platform).
        return CPUAttentionBackend.get_name()

    @staticmethod
    def get_impl_cls():
        return CPUTreeAttentionImpl
