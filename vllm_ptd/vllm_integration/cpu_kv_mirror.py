"""Per-request unpacked copies of the KV cache ("mirrors") for CPU tree attention.

vLLM's CPU cache packs K and V per block in an ISA-specific order, so reading a request's
context for masked attention costs, per layer and step, a gather of all its blocks and an
unpacking copy of each (0.28 ms per layer for a 16-row tree over 300 tokens, 0.71 over 1000;
0.14 and 0.32 through a mirror). A mirror keeps, per request and layer, K and V as
[2, kv_heads, capacity, head_size] in the cache's dtype, equal to the cache at every position
below the layer's `valid` mark.
Each tree step then only:

1. reads from the cache the positions committed since the mark (the nodes accepted last step,
   already compacted; the tokens of steps that ran without a tree; a whole prompt the first
   time), through flat element indices built once per step;
2. writes its own tree rows from the layer's key/value inputs, which are exactly what vLLM
   just wrote into the cache (a raw copy: PTD refuses fp8 caches);
3. moves the mark to x's position + 1: x is committed, its tree rows beyond are speculative.

Because everything below the mark was read from (or is bitwise what vLLM wrote into) the
cache, a mirror never needs invalidating while the request keeps its blocks; it is dropped
when the request finishes, is aborted, preempted or resumed (the proposer's `forget`).

Memory: num_layers * 2 * kv_heads * head_size * dtype bytes per token of context (23 KiB in
bf16 for the embedded model). The store stops creating or growing mirrors beyond its byte
limit; such requests use the gathering path, which needs no extra memory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from vllm_ptd.cpu_features import cpu_has_any_flag
from vllm_ptd.vllm_integration.cpu_kv_layout import BlockLayout, flat_kv_index

logger = logging.getLogger("vllm.ptd")

# Limit on the capacity reserved by all mirrors of one worker together.
DEFAULT_LIMIT_BYTES = 512 << 20
# Capacity grows in steps of this many tokens (and at least by half), so that a growing
# context reallocates rarely.
CAPACITY_QUANTUM = 256


class KVMirror:
    """One request's mirrors, one buffer per attention layer (keyed by layer name)."""

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}   # [2, kv_heads, capacity, head_size]
        self.valid: dict[str, int] = {}              # positions below are equal to the cache
        self.capacity = 0                            # tokens, the same for every layer
        self.reserved_bytes = 0                      # capacity in every layer of the worker

    def buffer(self, layer: str, kv_heads: int, head_size: int, dtype: torch.dtype
               ) -> torch.Tensor:
        """The layer's buffer at the mirror's capacity (grown and copied when it is not)."""
        buf = self.buffers.get(layer)
        if buf is not None and buf.shape[2] == self.capacity and buf.dtype == dtype:
            return buf
        new = torch.zeros(2, kv_heads, self.capacity, head_size, dtype=dtype)
        if buf is not None and buf.dtype == dtype:
            keep = min(self.valid.get(layer, 0), buf.shape[2], self.capacity)
            new[:, :, :keep] = buf[:, :, :keep]
        else:
            self.valid[layer] = 0
        self.buffers[layer] = new
        return new


class KVMirrorStore:
    """All mirrors of one engine's worker, keyed by request id (owned by the proposer, so
    engines sharing a process never see each other's requests)."""

    def __init__(self, num_layers: int, limit_bytes: int = DEFAULT_LIMIT_BYTES) -> None:
        self.num_layers = num_layers   # attention layers of this worker (sizes a token)
        self.limit_bytes = limit_bytes
        self.mirrors: dict[str, KVMirror] = {}
        self.reserved_bytes = 0   # of all mirrors, kept as they change (reserve runs per step)

    def __len__(self) -> int:
        return len(self.mirrors)

    def release(self, req_id: str) -> None:
        mirror = self.mirrors.pop(req_id, None)
        if mirror is not None:
            self.reserved_bytes -= mirror.reserved_bytes

    def reserve(self, req_id: str, length: int, layer_bytes_per_token: int
                ) -> KVMirror | None:
        """The request's mirror with room for `length` tokens, or None when creating or
        growing it would pass the limit (that request then takes the gathering path).
        layer_bytes_per_token: K and V of one token in one layer."""
        mirror = self.mirrors.get(req_id)
        if mirror is not None and mirror.capacity >= length:
            return mirror
        old = 0 if mirror is None else mirror.capacity
        capacity = max(-(-length // CAPACITY_QUANTUM) * CAPACITY_QUANTUM, old + old // 2)
        extra = (capacity - old) * layer_bytes_per_token * self.num_layers
        if self.reserved_bytes + extra > self.limit_bytes:
            return None
        if mirror is None:
            mirror = self.mirrors[req_id] = KVMirror()
        mirror.capacity = capacity
        mirror.reserved_bytes += extra
        self.reserved_bytes += extra
        return mirror


@dataclass
class MirroredBlock:
    """One request's tree block of this step, attended through its mirror."""

    mirror: KVMirror
    start: int             # batch rows [start, start + size)
    size: int
    prefix: int            # x's position: positions below are committed
    length: int            # prefix + size
    block_row: torch.Tensor  # int64: the request's KV block ids
    bias: torch.Tensor     # [1, 1, group * size, length], KV dtype: 0 visible, -inf hidden
    # flat element indices of positions [valid, end) in a layer's cache, per (valid, end)
    refresh: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    # the extend kernel's per-step arguments, built by the first layer that uses it
    extend_args: tuple | None = None


def block_bias(mask: torch.Tensor, prefix: int, group: int, dtype: torch.dtype,
               rows: int | None = None, width: int | None = None) -> torch.Tensor:
    """Additive attention mask [1, 1, group * rows, width] of one block's rows (0 visible,
    -inf hidden): the committed prefix fully visible, the block's own tokens per the tree mask
    (bool [size, size]), keys past the block hidden; rows repeated per query head of a KV head
    (GQA grouping). Padding up to `rows` (default: the block's size) and `width` (default:
    prefix + size), for blocks attended together in one padded batch: a padding row sees key
    0 alone, so its softmax stays finite."""
    size = mask.shape[0]
    rows = size if rows is None else rows
    width = prefix + size if width is None else width
    visible = torch.zeros(rows, width, dtype=torch.bool)
    visible[:size, :prefix] = True
    visible[:size, prefix:prefix + size] = mask
    visible[size:, 0] = True
    bias = torch.zeros(rows, width, dtype=dtype).masked_fill_(~visible, float("-inf"))
    return bias.repeat(group, 1)[None, None]


def _tree_kv_rows(key: torch.Tensor, value: torch.Tensor, start: int, n: int
                  ) -> torch.Tensor | None:
    """Rows [start, start + n) of key and value as one [2, kv_heads, n, head_size] view, when
    value sits right after key in every row (both are views of the layer's fused qkv
    projection, as in vLLM's decoder layers): one copy writes both into a mirror. None when
    they are laid out otherwise, or merely sit side by side in separate storages (a view
    past key's own storage would be out of bounds)."""
    heads, head_size = key.shape[-2], key.shape[-1]
    if (key.dim() != 3 or value.shape != key.shape or value.stride() != key.stride()
            or key.stride(-1) != 1 or key.stride(-2) != head_size
            or value.data_ptr() - key.data_ptr() != heads * head_size * key.element_size()
            or value.untyped_storage().data_ptr() != key.untyped_storage().data_ptr()):
        return None
    row = key.stride(0)
    return key.as_strided((2, heads, n, head_size), (heads * head_size, head_size, row, 1),
                          key.storage_offset() + start * row)


def mirrored_attention(layer: str, blk: MirroredBlock, query: torch.Tensor,
                       key: torch.Tensor | None, value: torch.Tensor | None,
                       kv_cache: torch.Tensor, output: torch.Tensor, layout: BlockLayout,
                       scale: float) -> None:
    """Tree attention of one block through its mirror; writes the block's output rows.
    query/output: [tokens, heads, head_size]; key/value: [tokens, kv_heads, head_size] (the
    views vLLM's Attention layer passes)."""
    _, num_kv_heads, block_size, two_hs = kv_cache.shape
    head_size = two_hs // 2
    n, prefix, length, start = blk.size, blk.prefix, blk.length, blk.start
    group = blk.bias.shape[2] // n
    buf = blk.mirror.buffer(layer, num_kv_heads, head_size, kv_cache.dtype)
    valid = min(blk.mirror.valid.get(layer, 0), prefix)
    # Without the layer's own K/V inputs (shared-KV layers) the tree rows come from the cache.
    end = prefix if key is not None else length
    if valid < end:
        index = blk.refresh.get((valid, end))
        if index is None:
            index = blk.refresh[(valid, end)] = flat_kv_index(
                blk.block_row, valid, end, layout, num_kv_heads, block_size, head_size)
        buf[:, :, valid:end] = torch.take(kv_cache, index)
    if key is not None:
        key = key.view(-1, num_kv_heads, head_size)
        value = value.view(-1, num_kv_heads, head_size)
        rows = _tree_kv_rows(key, value, start, n)
        if rows is not None:
            buf[:, :, prefix:length] = rows
        else:
            buf[0, :, prefix:length] = key[start: start + n].transpose(0, 1)
            buf[1, :, prefix:length] = value[start: start + n].transpose(0, 1)
    blk.mirror.valid[layer] = prefix + 1
    if key is not None and _extend_kernel_serves(query, buf, output) and _extend_attention(
            blk, query, key, value, buf, output, group * num_kv_heads, head_size, scale):
        return
    q = query.view(-1, num_kv_heads, group, head_size)[start: start + n]
    q = q.permute(1, 2, 0, 3).reshape(1, num_kv_heads, group * n, head_size)
    if q.dtype != buf.dtype:
        q = q.to(buf.dtype)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, buf[0, None, :, :length], buf[1, None, :, :length], attn_mask=blk.bias,
        scale=scale)  # [1, H, g*n, hs]
    output.view(-1, num_kv_heads, group, head_size)[start: start + n].copy_(
        out.view(num_kv_heads, group, n, head_size).permute(2, 0, 1, 3))


def _extend_kernel_serves(query: torch.Tensor, buf: torch.Tensor, output: torch.Tensor) -> bool:
    """vLLM's CPU extend kernel (SGLang's `extend_attention_cpu`, with a tree mask) runs
    bf16 blocks: 0.5-0.86x the SDPA call's time per layer
    (benchmarks/bench_cpu_tree_attention.py). Only bf16, and only on CPUs with bf16 dot
    products, where its results are checked (tests/test_cpu_kv_mirror.py): on a CPU with
    AVX512-FP16 but not AMX-FP16 it ran fp16 without complaint and returned wrong rows.
    Float32 and fp16 keep SDPA."""
    return (buf.dtype == torch.bfloat16 and query.dtype == buf.dtype
            and output.dtype == buf.dtype and _has_extend_kernel())


def _has_extend_kernel() -> bool:
    """The op exists with the arguments this module passes (vLLM 0.32's CPU build; any
    other signature keeps SDPA rather than guessing at a changed kernel) and the CPU has
    bf16 dot products (EXTEND_KERNEL_CPU_FLAGS); False from its first refusal on."""
    global _EXTEND_KERNEL
    if _EXTEND_KERNEL is None:
        try:
            schema = str(torch.ops._C.extend_attention_cpu.default._schema)
        except (AttributeError, RuntimeError):
            schema = None
        _EXTEND_KERNEL = (schema == EXTEND_KERNEL_SCHEMA
                          and cpu_has_any_flag(*EXTEND_KERNEL_CPU_FLAGS))
    return _EXTEND_KERNEL


EXTEND_KERNEL_SCHEMA = (
    "_C::extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, "
    "Tensor(a!) o_extend, Tensor k_buffer, Tensor v_buffer, Tensor req_to_token, "
    "Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, "
    "Tensor extend_start_loc, int max_len_extend, float sm_scale, float logit_cap, "
    "bool is_cross_attn, int sliding_window_size, Tensor? encoder_lens, Tensor? sinks, "
    "Tensor? tree_mask=None) -> ()")
# bf16 dot products (AVX512-BF16 or AMX-BF16): the CPUs the kernel's bf16 rows are checked on
EXTEND_KERNEL_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
_EXTEND_KERNEL: bool | None = None   # see `_has_extend_kernel`


def _extend_attention(blk: MirroredBlock, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, buf: torch.Tensor, output: torch.Tensor,
                      num_heads: int, head_size: int, scale: float) -> bool:
    """The block's rows through the extend kernel: the committed prefix read from the mirror
    (a token-major strided view), the tree rows from this layer's own K/V, the tree mask
    over the block. Writes the block's output rows in place; False when the kernel refuses
    (it checks the CPU's features before computing anything): SDPA from then on."""
    global _EXTEND_KERNEL
    n, start, num_kv_heads = blk.size, blk.start, buf.shape[1]
    if blk.extend_args is None:
        own = blk.bias[0, 0, :n, blk.prefix:blk.length] == 0   # the tree mask, row sees column
        blk.extend_args = (torch.arange(blk.length, dtype=torch.int32)[None],
                           torch.zeros(1, dtype=torch.int64),
                           torch.tensor([blk.length], dtype=torch.int64),
                           torch.tensor([n], dtype=torch.int32),
                           torch.zeros(1, dtype=torch.int32),
                           own.reshape(-1).contiguous())
    to_token, pool_index, seq_lens, rows, first, tree_mask = blk.extend_args
    q = query.view(-1, num_heads, head_size)[start: start + n]
    k = key.view(-1, num_kv_heads, head_size)[start: start + n]
    v = value.view(-1, num_kv_heads, head_size)[start: start + n]
    out = output.view(-1, num_heads, head_size)[start: start + n]
    try:
        torch.ops._C.extend_attention_cpu(
            q, k, v, out, buf[0].transpose(0, 1), buf[1].transpose(0, 1), to_token,
            pool_index, seq_lens, rows, first, n, scale, 0.0, False, 0, None, None, tree_mask)
    except RuntimeError as err:
        _EXTEND_KERNEL = False
        logger.warning("PTD: vLLM's CPU extend kernel refuses %s here (%s); tree rows use "
                       "PyTorch SDPA instead", buf.dtype, err)
        return False
    return True
