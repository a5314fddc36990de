"""Move accepted tree nodes' KV into the contiguous slots after x, in every layer.

Order safety: within a request the accepted path's node indices increase and node k of the
path lands on slot k <= its own index, so no destination is a later source. The CPU path reads
every source before writing any destination, which is safe regardless.
"""

from __future__ import annotations

import torch


def compact_accepted_kv(runner, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
    caches = [c for c in runner.kv_caches if c is not None]
    if not caches:
        return
    if caches[0].device.type == "cpu":
        _compact_cpu(runner, caches, src_slots, dst_slots)
    else:
        # vLLM 0.32's Triton backend keeps one [num_blocks, kv_heads, block_size, 2*hs]
        # tensor per layer, unpacked: the kernel's "cpu"-shaped layout (named for its shape).
        from vllm_ptd.kernels import compact_kv

        compact_kv(caches, src_slots.to(caches[0].device), dst_slots.to(caches[0].device),
                   layout="cpu")


def _compact_cpu(runner, caches, src_slots, dst_slots) -> None:
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from vllm_ptd.vllm_integration.cpu_kv_layout import probe_layout, read_kv, write_kv

    _, _, block_size, two_hs = caches[0].shape
    isa = _get_attn_isa(caches[0].dtype, block_size, two_hs // 2,
                        runner.cache_config.cache_dtype)
    layout = probe_layout(isa, caches[0].dtype, block_size, two_hs // 2)
    for cache in caches:
        key, value = read_kv(cache, src_slots, layout)
        write_kv(cache, key.contiguous(), value.contiguous(), dst_slots, isa)
