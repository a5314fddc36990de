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
from vllm_ptd.vllm_integration.cpu_kv_layout import probe_layout, read_sequence


class CPUTreeAttentionImpl(CPUAttentionBackendImpl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        tree = get_tree_attention_metadata()
        if tree is None or attn_metadata is None or not tree.blocks:
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                   output_scale, output_block_scale)
        if sum(b.size for b in tree.blocks) < attn_metadata.num_actual_tokens:
            # Rows outside any tree (prefill chunks, plain decodes) need the native kernel.
            super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                            output_scale, output_block_scale)
        if self.sliding_window != -1 or self.alibi_slopes is not None or self.logits_soft_cap:
            raise ValueError("PTD tree attention does not support sliding window, ALiBi or "
                             "soft-capping on CPU")
        if self.is_fp8_kv_cache or self.sinks is not None:
            raise ValueError("PTD tree attention does not support fp8 KV cache or sinks on CPU")
        _, _, block_size, two_hs = kv_cache.shape
        layout = probe_layout(layer.isa, kv_cache.dtype, block_size, two_hs // 2)
        seq_lens = attn_metadata.seq_lens
        block_table = attn_metadata.block_table
        group = self.num_heads // self.num_kv_heads
        for blk in tree.blocks:
            seq_len = int(seq_lens[blk.req_index])
            prefix = seq_len - blk.size
            num_blocks = (seq_len + block_size - 1) // block_size
            k, v = read_sequence(kv_cache, block_table[blk.req_index, :num_blocks].long(),
                                 seq_len, layout)                      # [kv_heads, L, hs]
            # Queries grouped per KV head ([kv_heads, group * n, hs]) so GQA needs no K/V
            # copies; plain matmuls beat SDPA with a mask here (measured ~1.5x on CPU).
            n = blk.size
            q = query[blk.start: blk.start + n].view(n, self.num_kv_heads, group, -1)
            q = q.permute(1, 2, 0, 3).reshape(self.num_kv_heads, group * n, -1).to(k.dtype)
            scores = torch.matmul(q, k.transpose(1, 2)).float().mul_(self.scale)
            hidden = ~blk.mask.repeat(group, 1)
            scores[:, :, prefix:].masked_fill_(hidden, float("-inf"))
            out = torch.matmul(scores.softmax(dim=-1).to(v.dtype), v)  # [kv_heads, g*n, hs]
            out = out.view(self.num_kv_heads, group, n, -1).permute(2, 0, 1, 3)
            rows = output[blk.start: blk.start + n]
            rows.copy_(out.reshape(rows.shape))
        return output


class CPUTreeAttentionBackend(CPUAttentionBackend):
    @staticmethod
    def get_name() -> str:
        # Keep vLLM's name: parts of vLLM compare backend names (e.g. for the CPU platform).
        return CPUAttentionBackend.get_name()

    @staticmethod
    def get_impl_cls():
        return CPUTreeAttentionImpl
