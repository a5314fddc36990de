"""Move accepted tree nodes' KV into the contiguous slots after x, in every layer.

Order safety: within a request the accepted path's node indices increase and node k of the
path lands on slot k <= its own index, so no destination is a later source. The CPU path reads
every source before writing any destination, which is safe regardless.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_ptd.attention.tree_metadata import uses_packed_tree_backend
from vllm_ptd.vllm_integration.step_transfers import StepTransfers


def compact_accepted_kv(runner, pairs: np.ndarray, transfers: StepTransfers) -> None:
    """Move KV from slot pairs[0, i] to slot pairs[1, i], in every layer (pairs: int64
    [2, M], C-contiguous)."""
    caches = [c for c in runner.kv_caches if c is not None]
    if not caches:
        return
    # The cache's layout is the attention backend's (the CPU backend packs it per ISA, the
    # Triton backend keeps it unpacked), whatever the device.
    if not uses_packed_tree_backend(runner):
        pairs = torch.from_numpy(np.ascontiguousarray(pairs))
        _compact_cpu(runner, caches, pairs[0], pairs[1])
        return
    # vLLM 0.32's Triton backend keeps one [num_blocks, kv_heads, block_size, 2*hs]
    # tensor per layer, unpacked: the kernel's "cpu"-shaped layout (named for its shape).
    # Sources, destinations and the single group's bounds go up in one upload.
    from vllm_ptd.kernels import compact_kv

    num = pairs.shape[1]
    up = transfers.upload("compaction", np.concatenate([pairs.reshape(-1), [0, num]]),
                          torch.int64)
    compact_kv(caches, up[:num], up[num: 2 * num], pair_start_loc=up[2 * num:],
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
