"""Read and move tokens' K/V in vLLM's CPU paged KV cache, whatever its ISA-specific packing.

vLLM 0.32's CPU cache is one tensor per layer, [num_blocks, num_kv_heads, block_size,
2 * head_size], whose K half is stored in an ISA-dependent packed order ("vec", "vec16",
"amx", ...) written by the compiled `cpu_attn_reshape_and_cache`. Rather than hard-coding
each packing, we *probe* it once: write tokens whose values encode (token offset, dim) through
vLLM's own writer and read back where each element landed. Writing always goes through vLLM's
writer, so compaction never depends on the probe for correctness of the write.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass(frozen=True)
class BlockLayout:
    """Where token t, dim d of one (block, kv head) sits inside that block-head's K and V spans."""

    key_index: torch.Tensor    # int64 [block_size, head_size] into the K span (block_size*head_size)
    value_index: torch.Tensor  # int64 [block_size, head_size] into the V span


def _split(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V views exactly as vLLM's CPU backend makes them."""
    num_blocks, num_kv_heads, block_size, _ = kv_cache.shape
    view = kv_cache.view(num_blocks, num_kv_heads, block_size * 2, -1)
    key_cache, value_cache = view.chunk(2, dim=2)
    return key_cache, value_cache


def write_kv(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             slots: torch.Tensor, isa: str) -> None:
    """Write [n, kv_heads, head_size] key/value at flat slots with vLLM's own CPU writer."""
    from vllm import _custom_ops as ops

    key_cache, value_cache = _split(kv_cache)
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa,
                                   k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")


@lru_cache(maxsize=16)
def probe_layout(isa: str, dtype: torch.dtype, block_size: int, head_size: int) -> BlockLayout:
    """Find the packing of one block-head span by writing coded values with vLLM's writer."""
    cache = torch.zeros(1, 1, block_size, 2 * head_size, dtype=dtype)
    slots = torch.arange(block_size, dtype=torch.int64)
    # Codes 1..block_size and 1..head_size are exact in every float dtype used here (<= 256
    # would be exact even in bf16); two probes give the token and the dim of every element.
    tok_code = (torch.arange(block_size, dtype=torch.float32) + 1)[:, None, None]
    dim_code = (torch.arange(head_size, dtype=torch.float32) + 1)[None, None, :]
    coded = []
    for code in (tok_code.expand(block_size, 1, head_size), dim_code.expand(block_size, 1, head_size)):
        cache.zero_()
        data = code.to(dtype).contiguous()
        write_kv(cache, data, data, slots, isa)
        key_cache, value_cache = _split(cache)
        coded.append((key_cache.reshape(-1).float().clone(), value_cache.reshape(-1).float().clone()))
    index = []
    for part in (0, 1):
        toks, dims = coded[0][part], coded[1][part]
        if bool((toks == 0).any()) or bool((dims == 0).any()):
            raise RuntimeError(f"unexpected CPU KV packing for isa={isa}: holes in the probe")
        flat = (toks.long() - 1) * head_size + (dims.long() - 1)
        if flat.unique().numel() != block_size * head_size:
            raise RuntimeError(f"unexpected CPU KV packing for isa={isa}: not a permutation")
        inverse = torch.empty_like(flat)
        inverse[flat] = torch.arange(flat.numel())
        index.append(inverse.view(block_size, head_size))
    return BlockLayout(key_index=index[0], value_index=index[1])


def read_kv(kv_cache: torch.Tensor, slots: torch.Tensor, layout: BlockLayout
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather K and V at flat slots: two [n, kv_heads, head_size] tensors (for a few tokens)."""
    num_blocks, num_kv_heads, block_size, two_hs = kv_cache.shape
    key_cache, value_cache = _split(kv_cache)
    span = block_size * (two_hs // 2)
    blocks = (slots // block_size)[:, None, None]
    offsets = slots % block_size
    heads = torch.arange(num_kv_heads)[None, :, None]
    key = key_cache.reshape(num_blocks, num_kv_heads, span)[
        blocks, heads, layout.key_index[offsets][:, None, :]]
    value = value_cache.reshape(num_blocks, num_kv_heads, span)[
        blocks, heads, layout.value_index[offsets][:, None, :]]
    return key, value


def flat_kv_index(block_row: torch.Tensor, begin: int, end: int, layout: BlockLayout,
                  num_kv_heads: int, block_size: int, head_size: int) -> torch.Tensor:
    """Flat element indices [2, kv_heads, end - begin, head_size] of K (0) and V (1) at
    positions [begin, end) in a layer's cache viewed flat: element (block, head, o) of
    [num_blocks, kv_heads, block_size, 2 * head_size] is at (block * H + head) * span + o,
    K in the first block_size * head_size of each span."""
    span = block_size * 2 * head_size
    pos = torch.arange(begin, end)
    base = (block_row[pos // block_size] * (num_kv_heads * span))[None, :, None]
    heads = (torch.arange(num_kv_heads) * span)[:, None, None]
    offset = pos % block_size
    keys = base + heads + layout.key_index[offset][None]
    values = base + heads + (layout.value_index[offset] + block_size * head_size)[None]
    return torch.stack([keys, values])


@dataclass(frozen=True)
class SpanPermutation:
    """A packing that is a pure reordering of index bits: the span viewed as `shape` and
    permuted by `perm` gives the tensor in [outer, inner] order (token-major [bs, hs] or
    dim-major [hs, bs]); `outer_axes` of the permuted axes make up the outer dimension."""

    shape: tuple[int, ...]
    perm: tuple[int, ...]
    outer_axes: int


def span_permutation(index: torch.Tensor, token_major: bool) -> SpanPermutation | None:
    """Describe a probed packing (`index[t, d]` = offset in the span) as a reshape + permute,
    or None when it is not one. All of vLLM 0.32's CPU packings (vec, vec16 and AMX's VNNI
    tiles) are bit permutations of (token, dim) when block and head sizes are powers of two;
    the result is verified against `index` in full before it is used."""
    block_size, head_size = index.shape
    t_bits, d_bits = block_size.bit_length() - 1, head_size.bit_length() - 1
    if 1 << t_bits != block_size or 1 << d_bits != head_size:
        return None
    total = t_bits + d_bits
    # Output bit position of every input bit (token bits, then dim bits; LSB first).
    unit = [int(index[1 << i, 0]) for i in range(t_bits)]
    unit += [int(index[0, 1 << j]) for j in range(d_bits)]
    if int(index[0, 0]) != 0 or any(u <= 0 or u & (u - 1) for u in unit):
        return None
    out_bit = [u.bit_length() - 1 for u in unit]
    if sorted(out_bit) != list(range(total)):
        return None
    token_bits = [out_bit[i] for i in reversed(range(t_bits))]          # MSB first
    dim_bits = [out_bit[t_bits + j] for j in reversed(range(d_bits))]
    wanted = token_bits + dim_bits if token_major else dim_bits + token_bits
    # Span viewed as [2] * total: axis k holds output bit total - 1 - k.
    perm = [total - 1 - b for b in wanted]
    # Merge runs of consecutive source axes into single axes, never across the boundary
    # between the outer and inner dimension.
    outer_len = t_bits if token_major else d_bits
    runs: list[list[int]] = []
    for k, axis in enumerate(perm):
        if runs and k != outer_len and axis == runs[-1][-1] + 1:
            runs[-1].append(axis)
        else:
            runs.append([axis])
    outer_axes = sum(1 for r in runs if perm.index(r[0]) < outer_len)
    order = sorted(range(len(runs)), key=lambda r: runs[r][0])
    shape = tuple(2 ** len(runs[r]) for r in order)
    merged_perm = tuple(order.index(r) for r in range(len(runs)))
    result = SpanPermutation(shape, merged_perm, outer_axes)
    codes = torch.arange(block_size * head_size).view(shape).permute(merged_perm)
    expected = index if token_major else index.T
    if not torch.equal(codes.reshape(expected.shape), expected):
        return None
    return result
